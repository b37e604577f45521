package sqlguard_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// waitFor polls cond every 10ms until it holds or 20s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// checkUnknown fails unless err matches fence.ErrOutcomeUnknown and cause.
func checkUnknown(t *testing.T, err, cause error) {
	t.Helper()
	if !errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, cause) {
		t.Fatalf("got %v; want an error matching fence.ErrOutcomeUnknown and %v", err, cause)
	}
	if errors.Is(err, fence.ErrStaleToken) || sqlguard.IsRetryable(err) {
		t.Fatalf("%v: an unknown outcome is neither stale nor retryable", err)
	}
}

// TestTableWriteOutcomeUnknown: a write whose context ends while the
// statement is at the server (here: waiting for a row lock) returns
// fence.ErrOutcomeUnknown joined with the context's error, because the
// server may still apply it, and here does: the cancel request that pgx
// sends is lost (as behind a pooler or a firewall), and the write lands
// once the lock is released. A context that ended before anything was
// sent gives a plain error.
func TestTableWriteOutcomeUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.accountsTable(t, "accounts", 1, 1)
	w := &wire{dropCancels: true}
	for i, via := range []struct {
		name string
		db   sqlguard.DBTX
	}{
		{"pool", e.wirePool(t, w, 2)},
		{"conn", e.wireConnect(t, w, nil)},
	} {
		t.Run(via.name, func(t *testing.T) {
			balance := 1000 + i
			token := fence.Token(10 + i)
			holder, err := e.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx)
			if _, err := holder.Exec(ctx, `SELECT 1 FROM accounts WHERE id = 1 FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			// A connection already open, so that the deadline falls while
			// the statement waits for the row lock, not while dialling.
			if _, err := via.db.Exec(ctx, `SELECT 1`); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			err = tbl.Update(wctx, via.db, []any{1}, token, sqlguard.Col("balance", balance))
			cancel()
			checkUnknown(t, err, context.DeadlineExceeded)
			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			// "Unknown" is the truth: the statement was still running.
			waitFor(t, "the abandoned write to land", func() bool {
				return e.row(t, "accounts", 1) == row{true, "ann", balance, int64(token)}
			})
		})
	}
	t.Run("context ended before sending", func(t *testing.T) {
		done, cancel := context.WithCancel(ctx)
		cancel()
		err := tbl.Update(done, e.Pool, []any{1}, 99, sqlguard.Col("balance", 1))
		if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("got %v; want a plain context.Canceled", err)
		}
		if r := e.row(t, "accounts", 1); r.lockVersion == 99 {
			t.Fatal("written")
		}
	})
}

// TestBeginFuncCommitOutcomeUnknown: a fenced transaction whose context
// ends while its COMMIT is at the server returns fence.ErrOutcomeUnknown:
// the commit may still happen, and here does (a deferred trigger makes the
// commit wait for an advisory lock the test holds). A context that ends
// before COMMIT was sent leaves nothing committed (PostgreSQL rolls back
// the transaction of a closed connection), so that error is plain.
func TestBeginFuncCommitOutcomeUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	lockKey := int64(binary.LittleEndian.Uint64(b[:]) >> 1)
	e.exec(t, `CREATE TABLE journal (lock_key bigint NOT NULL, note text NOT NULL)`)
	e.exec(t, `CREATE FUNCTION journal_wait() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(NEW.lock_key); RETURN NULL; END $$`)
	e.exec(t, `CREATE CONSTRAINT TRIGGER journal_wait AFTER INSERT ON journal
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION journal_wait()`)
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{dropCancels: true}
	db := e.wirePool(t, w, 2)

	locker := connect(t, ctx, e.Schema)
	if _, err := locker.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		t.Fatal(err)
	}
	// A connection already open, so that the deadline falls while COMMIT
	// waits for the advisory lock, not while dialling or before COMMIT.
	if _, err := db.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	err = g.BeginFunc(wctx, db, "journal", 5, func(tx pgx.Tx) error {
		_, err := tx.Exec(wctx, `INSERT INTO journal VALUES ($1, 'at commit')`, lockKey)
		return err
	})
	cancel()
	checkUnknown(t, err, context.DeadlineExceeded)
	if _, err := locker.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockKey); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the abandoned commit to land", func() bool {
		return e.int64Query(t, `SELECT count(*) FROM journal WHERE note = 'at commit'`) == 1 && e.storedToken(t, "journal") == 5
	})

	t.Run("context ended in the advance", func(t *testing.T) {
		// A newer holder keeps the resource's row locked.
		advanced, release := make(chan struct{}), make(chan struct{})
		newer := make(chan error, 1)
		go func() {
			newer <- g.BeginFunc(ctx, e.Pool, "journal", 7, func(pgx.Tx) error { close(advanced); <-release; return nil })
		}()
		<-advanced
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := g.BeginFunc(wctx, db, "journal", 6, func(tx pgx.Tx) error {
			_, err := tx.Exec(wctx, `INSERT INTO journal VALUES ($1, 'never')`, lockKey)
			return err
		})
		cancel()
		close(release)
		if err := <-newer; err != nil {
			t.Fatal(err)
		}
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("got %v; want a plain context.DeadlineExceeded", err)
		}
		if n := e.int64Query(t, `SELECT count(*) FROM journal WHERE note = 'never'`); n != 0 {
			t.Fatal("fn ran")
		}
	})
}
