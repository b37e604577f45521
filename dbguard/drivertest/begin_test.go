package drivertest

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// TestBeginFuncHoldsTheFence: while a holder's fenced transaction is open,
// a newer holder's BeginFunc waits at its advance (a record lock on MySQL,
// the write lock on SQLite), and its function sees the older holder's
// committed write; the older holder, coming back afterwards, is stale and
// its function never runs.
func TestBeginFuncHoldsTheFence(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			db.Exec(t, `CREATE TABLE kv (k INT PRIMARY KEY, v `+valueColumn(d)+`)`)
			db.Exec(t, `INSERT INTO kv (k, v) VALUES (1, 'initial')`)
			g, err := dbguard.New(d)
			if err != nil {
				t.Fatal(err)
			}
			ctx := testkit.Context(t)
			inside := make(chan struct{})
			release := make(chan struct{})
			aDone := make(chan error, 1)
			go func() {
				aDone <- g.BeginFunc(ctx, db.SQL, "job", 5, func(tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, `UPDATE kv SET v = 'A' WHERE k = 1`); err != nil {
						return err
					}
					close(inside)
					<-release
					return nil
				})
			}()
			<-inside
			bSaw := make(chan string, 1)
			bDone := make(chan error, 1)
			go func() {
				bDone <- g.BeginFunc(ctx, db.SQL, "job", 6, func(tx *sql.Tx) error {
					var v string
					if err := tx.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = 1`).Scan(&v); err != nil {
						return err
					}
					bSaw <- v
					_, err := tx.ExecContext(ctx, `UPDATE kv SET v = 'B' WHERE k = 1`)
					return err
				})
			}()
			select {
			case v := <-bSaw:
				t.Fatalf("the newer holder ran its function (saw %q) while the older one held the fence", v)
			case err := <-bDone:
				t.Fatalf("the newer holder returned %v while the older one held the fence", err)
			default:
			}
			close(release)
			if err := <-aDone; err != nil {
				t.Fatalf("older holder: %v", err)
			}
			if err := <-bDone; err != nil {
				t.Fatalf("newer holder: %v", err)
			}
			if v := <-bSaw; v != "A" {
				t.Fatalf("the newer holder's function saw %q; want the older holder's committed write", v)
			}
			ran := false
			err = g.BeginFunc(ctx, db.SQL, "job", 5, func(*sql.Tx) error { ran = true; return nil })
			var se *fence.StaleError
			if !errors.As(err, &se) || se.Presented != 5 || se.Current != 6 || ran {
				t.Fatalf("older holder again = %v (function ran: %v); want stale 5 < 6 before the function", err, ran)
			}
			var v string
			if err := db.SQL.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = 1`).Scan(&v); err != nil || v != "B" {
				t.Fatalf("final value %q, %v; want B", v, err)
			}
		})
	}
}

// TestAdvanceInOwnTransaction: Advance fences a transaction the caller
// manages; a stale advance leaves it to roll back.
func TestAdvanceInOwnTransaction(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			g, _ := dbguard.New(d)
			ctx := testkit.Context(t)
			for _, tc := range []struct {
				tok   fence.Token
				stale bool
			}{{10, false}, {10, false}, {9, true}, {11, false}} {
				tx, err := db.SQL.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				err = g.Advance(ctx, tx, "own", tc.tok)
				if got := errors.Is(err, fence.ErrStaleToken); got != tc.stale || (!tc.stale && err != nil) {
					t.Fatalf("Advance(%d) = %v; want stale=%v", tc.tok, err, tc.stale)
				}
				if err == nil {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestBeginFuncIsolationLevels: under MariaDB's REPEATABLE READ (its
// default) and READ COMMITTED alike, many first advances of new resources
// and re-advances race without a wrong answer: each is accepted, stale,
// or retryable (a deadlock), never anything else.
func TestBeginFuncIsolationLevels(t *testing.T) {
	for _, iso := range []sql.IsolationLevel{sql.LevelDefault, sql.LevelRepeatableRead, sql.LevelReadCommitted, sql.LevelSerializable} {
		t.Run(iso.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, dbguard.MySQL)
			g, err := dbguard.New(dbguard.MySQL, dbguard.WithTxOptions(sql.TxOptions{Isolation: iso}))
			if err != nil {
				t.Fatal(err)
			}
			ctx := testkit.Context(t)
			errs := make(chan error, 40)
			for i := range 40 {
				go func() {
					name := []string{"a", "b", "c", "d"}[i%4]
					errs <- g.BeginFunc(ctx, db.SQL, name, fence.Token(1+i/4), func(*sql.Tx) error { return nil })
				}()
			}
			for range 40 {
				err := <-errs
				if err != nil && !errors.Is(err, fence.ErrStaleToken) && !dbguard.IsRetryable(err) {
					t.Errorf("BeginFunc = %v", err)
				}
			}
		})
	}
}

// TestBeginFuncFunctionError: a function's writes are rolled back when
// the function fails, and a stale holder's function never runs.
func TestBeginFuncFunctionError(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			db.Exec(t, `CREATE TABLE kv (k INT PRIMARY KEY, v TEXT)`)
			g, _ := dbguard.New(d)
			ctx := testkit.Context(t)
			boom := errors.New("boom")
			err := g.BeginFunc(ctx, db.SQL, "f", 3, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES (1, 'x')`); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("BeginFunc = %v; want the function's error", err)
			}
			var n int
			if err := db.SQL.QueryRowContext(ctx, `SELECT COUNT(*) FROM kv`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("rows after a failed function: %d, %v", n, err)
			}
			// The advance was rolled back with it: token 2 is not stale.
			if err := g.BeginFunc(ctx, db.SQL, "f", 2, func(*sql.Tx) error { return nil }); err != nil {
				t.Fatalf("after a rolled-back advance to 3, token 2 = %v", err)
			}
		})
	}
}

// TestSQLiteWithoutBusyTimeout: SQLite has one writer. Without a busy
// timeout, a second writer's fenced transaction fails at once with
// SQLITE_BUSY while the first holds the write lock, reported as
// retryable, never as stale; with one it waits (TestBeginFuncHoldsTheFence).
func TestSQLiteWithoutBusyTimeout(t *testing.T) {
	db := OpenSQLite(t)
	noWait, err := sql.Open("sqlite", strings.Replace(db.DSN, "busy_timeout(10000)", "busy_timeout(0)", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer noWait.Close()
	g, _ := dbguard.New(dbguard.SQLite)
	ctx := testkit.Context(t)
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.BeginFunc(ctx, db.SQL, "busy", 5, func(*sql.Tx) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	err = g.BeginFunc(ctx, noWait, "busy", 6, func(*sql.Tx) error { return nil })
	close(release)
	if !dbguard.IsRetryable(err) || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("a second writer without a busy timeout = %v; want a retryable SQLITE_BUSY", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Once the lock is free, the same call succeeds.
	if err := g.BeginFunc(ctx, noWait, "busy", 6, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatalf("after the first writer committed: %v", err)
	}
}
