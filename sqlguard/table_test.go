package sqlguard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// outcome is what a write is expected to return.
type outcome int

const (
	written outcome = iota
	stale
	notFound
	exists
	ambiguous
)

func (o outcome) String() string {
	return [...]string{"written", "stale", "not found", "exists", "ambiguous"}[o]
}

// checkOutcome fails the test unless err is the expected outcome. For stale,
// it also checks the tokens the error carries.
func checkOutcome(t *testing.T, err error, want outcome, presented, current fence.Token, resource string) {
	t.Helper()
	switch want {
	case written:
		if err != nil {
			t.Fatalf("want written, got %v", err)
		}
	case stale:
		se, ok := fence.AsStale(err)
		if !ok || !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("want *fence.StaleError, got %v", err)
		}
		if se.Presented != presented || se.Current != current || se.Resource != resource {
			t.Fatalf("stale error = %+v, want presented %d current %d resource %q", *se, presented, current, resource)
		}
		if sqlguard.IsRetryable(err) {
			t.Fatalf("stale error must not be retryable")
		}
	case notFound, exists, ambiguous:
		target := map[outcome]error{notFound: fence.ErrNotFound, exists: fence.ErrExists, ambiguous: fence.ErrAmbiguousKey}[want]
		if !errors.Is(err, target) {
			t.Fatalf("want %v, got %v", target, err)
		}
		if errors.Is(err, fence.ErrStaleToken) || sqlguard.IsRetryable(err) {
			t.Fatalf("%v must be neither stale nor retryable", err)
		}
	}
}

func TestTableWriteOutcomes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	type write func(tbl *sqlguard.Table, db sqlguard.DBTX) error
	const tok = fence.Token(7)
	for i, tc := range []struct {
		name    string
		lv      int64 // lock_version of row 1 before the write
		write   write
		want    outcome
		after   row // row 1 afterwards (or row 3 for inserts: afterID)
		afterID int
	}{
		{"update written", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Update(ctx, db, []any{1}, tok, sqlguard.Col("balance", 150))
		}, written, row{true, "ann", 150, 7}, 1},
		{"update equal token", 7, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Update(ctx, db, []any{1}, tok, sqlguard.Col("balance", 150), sqlguard.Col("owner", "amy"))
		}, written, row{true, "amy", 150, 7}, 1},
		{"update first write on migrated row", 0, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Update(ctx, db, []any{1}, tok, sqlguard.Col("balance", 150))
		}, written, row{true, "ann", 150, 7}, 1},
		{"update no columns claims the row", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Update(ctx, db, []any{1}, tok)
		}, written, row{true, "ann", 100, 7}, 1},
		{"update stale", 9, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Update(ctx, db, []any{1}, tok, sqlguard.Col("balance", 150))
		}, stale, row{true, "ann", 100, 9}, 1},
		{"update not found", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Update(ctx, db, []any{99}, tok, sqlguard.Col("balance", 150))
		}, notFound, row{true, "ann", 100, 5}, 1},

		{"insert written", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Insert(ctx, db, []any{3}, tok, sqlguard.Col("owner", "cat"), sqlguard.Col("balance", 300))
		}, written, row{true, "cat", 300, 7}, 3},
		{"insert stale", 9, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Insert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "cat"))
		}, stale, row{true, "ann", 100, 9}, 1},
		{"insert exists", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Insert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "cat"))
		}, exists, row{true, "ann", 100, 5}, 1},

		{"upsert inserts", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Upsert(ctx, db, []any{3}, tok, sqlguard.Col("owner", "cat"), sqlguard.Col("balance", 300))
		}, written, row{true, "cat", 300, 7}, 3},
		{"upsert updates", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Upsert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "amy"), sqlguard.Col("balance", 150))
		}, written, row{true, "amy", 150, 7}, 1},
		{"upsert equal token", 7, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Upsert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "amy"), sqlguard.Col("balance", 150))
		}, written, row{true, "amy", 150, 7}, 1},
		{"upsert stale", 9, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Upsert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "amy"), sqlguard.Col("balance", 150))
		}, stale, row{true, "ann", 100, 9}, 1},

		{"delete written", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Delete(ctx, db, []any{1}, tok)
		}, written, row{}, 1},
		{"delete stale", 9, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Delete(ctx, db, []any{1}, tok)
		}, stale, row{true, "ann", 100, 9}, 1},
		{"delete not found", 5, func(tbl *sqlguard.Table, db sqlguard.DBTX) error {
			return tbl.Delete(ctx, db, []any{99}, tok)
		}, notFound, row{true, "ann", 100, 5}, 1},
	} {
		name := fmt.Sprintf("t%d", i)
		tbl := e.accountsTable(t, name, tc.lv, 2)
		// Each case through a pool, a connection and a transaction.
		for _, via := range []string{"pool", "conn", "tx"} {
			t.Run(tc.name+"/"+via, func(t *testing.T) {
				// Reset row 1 and remove row 3 before each run.
				e.exec(t, `DELETE FROM `+name+` WHERE id = 3`)
				e.exec(t, `INSERT INTO `+name+` (id, owner, balance, lock_version) VALUES (1, 'ann', 100, $1)
					ON CONFLICT (id) DO UPDATE SET owner = 'ann', balance = 100, lock_version = $1`, tc.lv)
				var err error
				switch via {
				case "pool":
					err = tc.write(tbl, e.Pool)
				case "conn":
					c := connect(t, ctx, e.Schema)
					err = tc.write(tbl, c)
				case "tx":
					// A rejected row write does not abort the transaction:
					// the caller may go on and commit.
					tx, berr := e.Pool.Begin(ctx)
					if berr != nil {
						t.Fatal(berr)
					}
					err = tc.write(tbl, tx)
					if cerr := tx.Commit(ctx); cerr != nil {
						t.Fatalf("commit after %v: %v", err, cerr)
					}
				}
				checkOutcome(t, err, tc.want, tok, fence.Token(tc.lv), fmt.Sprintf("%s(id=%d)", name, tc.afterID))
				if got := e.row(t, name, tc.afterID); got != tc.after {
					t.Fatalf("row %d after = %+v, want %+v", tc.afterID, got, tc.after)
				}
				if got := e.row(t, name, 2); got != (row{true, "bob", 200, 2}) {
					t.Fatalf("row 2 changed: %+v", got)
				}
			})
		}
	}
}

// TestTableStaleReportsCommittedVersion checks that the version in a stale
// error is the newest committed one, not the statement snapshot's: writer B
// starts while A holds the row with a newer, uncommitted token; A commits;
// B must report A's token (or, with a newer token, write over A's row).
func TestTableStaleReportsCommittedVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	type write func(tbl *sqlguard.Table, db sqlguard.DBTX, tok fence.Token) error
	kinds := []struct {
		name  string
		write write
	}{
		{"update", func(tbl *sqlguard.Table, db sqlguard.DBTX, tok fence.Token) error {
			return tbl.Update(ctx, db, []any{1}, tok, sqlguard.Col("balance", int(tok)))
		}},
		{"upsert", func(tbl *sqlguard.Table, db sqlguard.DBTX, tok fence.Token) error {
			return tbl.Upsert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "b"), sqlguard.Col("balance", int(tok)))
		}},
		{"insert", func(tbl *sqlguard.Table, db sqlguard.DBTX, tok fence.Token) error {
			return tbl.Insert(ctx, db, []any{1}, tok, sqlguard.Col("owner", "b"), sqlguard.Col("balance", int(tok)))
		}},
		{"delete", func(tbl *sqlguard.Table, db sqlguard.DBTX, tok fence.Token) error {
			return tbl.Delete(ctx, db, []any{1}, tok)
		}},
	}
	for i, k := range kinds {
		for _, tc := range []struct {
			bToken fence.Token
			want   outcome
			opaque bool // B through a DBTX that hides its connection: the exact statement alone
		}{{5, stale, false}, {12, written, false}, {5, stale, true}, {12, written, true}} {
			if k.name == "insert" && tc.want == written {
				tc.want = exists // a newer token does not make an insert of an existing row succeed
			}
			t.Run(fmt.Sprintf("%s/B=%d/opaque=%v", k.name, tc.bToken, tc.opaque), func(t *testing.T) {
				name := fmt.Sprintf("c%d_%d_%v", i, tc.bToken, tc.opaque)
				tbl := e.accountsTable(t, name, 1, 1)

				// A: token 10, holds the row in an open transaction.
				txA, err := e.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer txA.Rollback(ctx)
				if err := tbl.Update(ctx, txA, []any{1}, 10, sqlguard.Col("balance", 10)); err != nil {
					t.Fatalf("A: %v", err)
				}

				// B: starts now (its snapshot sees lock_version 1) and blocks.
				connB := connect(t, ctx, e.Schema)
				var dbB sqlguard.DBTX = connB
				if tc.opaque {
					dbB = opaqueDB{connB}
				}
				done := make(chan error, 1)
				go func() { done <- k.write(tbl, dbB, tc.bToken) }()
				waitBlocked(t, e, connB.PgConn().PID())
				if err := txA.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				err = <-done
				checkOutcome(t, err, tc.want, tc.bToken, 10, name+"(id=1)")
				got := e.row(t, name, 1)
				switch {
				case tc.want != written:
					if got != (row{true, "ann", 10, 10}) {
						t.Fatalf("row after rejected B = %+v, want A's", got)
					}
				case k.name == "delete":
					if got.found {
						t.Fatalf("row after B's delete = %+v, want deleted", got)
					}
				default:
					if got.lockVersion != 12 || got.balance != 12 {
						t.Fatalf("row after B = %+v, want B's write with lock_version 12", got)
					}
				}
			})
		}
	}
}

// opaqueDB hides everything of a DBTX but its three methods, so that
// sqlguard cannot see the connection: it runs the exact statement only.
type opaqueDB struct{ db sqlguard.DBTX }

func (o opaqueDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return o.db.Exec(ctx, sql, args...)
}

func (o opaqueDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return o.db.Query(ctx, sql, args...)
}

func (o opaqueDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return o.db.QueryRow(ctx, sql, args...)
}

// TestTableConcurrentInsert: a row with the key committed while Insert or
// Upsert waits for it. On a connection sqlguard can see, the success path
// finds the conflict and the exact statement that follows (a new
// snapshot) gives the definite answer at once: stale. Through a DBTX that
// hides its connection, only the exact statement runs; its snapshot cannot
// read the row, so it reports a retryable error (never success, never a
// made-up version), and a retry gives the definite answer.
func TestTableConcurrentInsert(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, kind := range []string{"insert", "upsert"} {
		for _, opaque := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s opaque=%v", kind, opaque), func(t *testing.T) {
				name := fmt.Sprintf("r_%s_%v", kind, opaque)
				tbl := e.accountsTable(t, name, 1, 1)
				connB := connect(t, ctx, e.Schema)
				var dbB sqlguard.DBTX = connB
				if opaque {
					dbB = opaqueDB{connB}
				}
				write := func() error {
					if kind == "insert" {
						return tbl.Insert(ctx, dbB, []any{3}, 5, sqlguard.Col("owner", "b"))
					}
					return tbl.Upsert(ctx, dbB, []any{3}, 5, sqlguard.Col("owner", "b"))
				}
				// B's first write to the table, so that its check is done.
				if err := tbl.Update(ctx, dbB, []any{1}, 1); err != nil {
					t.Fatal(err)
				}
				txA, err := e.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer txA.Rollback(ctx)
				if err := tbl.Insert(ctx, txA, []any{3}, 10, sqlguard.Col("owner", "a")); err != nil {
					t.Fatalf("A: %v", err)
				}
				done := make(chan error, 1)
				go func() { done <- write() }()
				waitBlocked(t, e, connB.PgConn().PID())
				if err := txA.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				err = <-done
				if opaque {
					if !errors.Is(err, fence.ErrRetryable) || !sqlguard.IsRetryable(err) || errors.Is(err, fence.ErrStaleToken) {
						t.Fatalf("B: want retryable, got %v", err)
					}
					err = write()
				}
				checkOutcome(t, err, stale, 5, 10, name+"(id=3)")
				if got := e.row(t, name, 3); got != (row{true, "a", 0, 10}) {
					t.Fatalf("row = %+v, want A's", got)
				}
			})
		}
	}
}

func TestTableAmbiguousKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE dup (k int NOT NULL, v int, lock_version bigint NOT NULL DEFAULT 0)`)
	e.exec(t, `INSERT INTO dup VALUES (1, 1, 0), (1, 2, 0)`)
	tbl, err := sqlguard.NewTable(e.Schema, "dup", "k")
	if err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func() error{
		"update": func() error { return tbl.Update(ctx, e.Pool, []any{1}, 3, sqlguard.Col("v", 9)) },
		"delete": func() error { return tbl.Delete(ctx, e.Pool, []any{1}, 3) },
	} {
		t.Run(name, func(t *testing.T) {
			checkOutcome(t, write(), ambiguous, 0, 0, "")
			if n := e.int64Query(t, `SELECT count(*) FROM dup WHERE k = 1 AND lock_version = 0 AND v IN (1, 2)`); n != 2 {
				t.Fatalf("rows changed: %d untouched, want 2", n)
			}
		})
	}
}

// TestTableDatabaseErrors: other database errors come back wrapped, with the
// *pgconn.PgError reachable, and are neither stale nor retryable.
func TestTableDatabaseErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.accountsTable(t, "accounts", 1, 1)
	missing, err := sqlguard.NewTable("", "no_such_table", "id")
	if err != nil {
		t.Fatal(err)
	}
	e.exec(t, `CREATE TABLE nokey (id int, lock_version bigint NOT NULL DEFAULT 0)`)
	nokey, err := sqlguard.NewTable("", "nokey", "id")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		write func() error
		code  string
	}{
		{"unknown column", func() error { return tbl.Update(ctx, e.Pool, []any{1}, 5, sqlguard.Col("nope", 1)) }, "42703"},
		{"unknown table", func() error { return missing.Update(ctx, e.Pool, []any{1}, 5) }, "42P01"},
		{"no unique index for upsert", func() error { return nokey.Upsert(ctx, e.Pool, []any{1}, 5) }, "42P10"},
		{"no unique index for insert", func() error { return nokey.Insert(ctx, e.Pool, []any{1}, 5) }, "42P10"},
		{"not null violation", func() error { return tbl.Insert(ctx, e.Pool, []any{3}, 5) }, "23502"},
		{"NUL in a text value", func() error {
			return tbl.Update(ctx, e.Pool, []any{1}, 5, sqlguard.Col("owner", "x\x00y"))
		}, ""}, // NUL in text: an encoding error, no PgError
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.write()
			if err == nil {
				t.Fatal("want an error")
			}
			if errors.Is(err, fence.ErrStaleToken) || sqlguard.IsRetryable(err) || errors.Is(err, fence.ErrNotFound) {
				t.Fatalf("%v: must be neither stale, retryable nor not found", err)
			}
			if tc.code == "" {
				return
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
				t.Fatalf("want PgError %s in %v", tc.code, err)
			}
		})
	}
}

// TestTableRetryable: under REPEATABLE READ, a fenced write of a row another
// transaction changed after the snapshot is a serialization failure; a
// deadlock between two fenced writers is 40P01. Both are retryable, never
// stale, and keep the PgError.
func TestTableRetryable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	t.Run("serialization failure", func(t *testing.T) {
		tbl := e.accountsTable(t, "rr", 1, 1)
		txB, err := e.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer txB.Rollback(ctx)
		if _, err := txB.Exec(ctx, `SELECT 1 FROM rr`); err != nil { // takes the snapshot
			t.Fatal(err)
		}
		if err := tbl.Update(ctx, e.Pool, []any{1}, 10, sqlguard.Col("balance", 10)); err != nil {
			t.Fatal(err)
		}
		err = tbl.Update(ctx, txB, []any{1}, 12, sqlguard.Col("balance", 12))
		checkRetryable(t, err, "40001")
	})

	t.Run("deadlock", func(t *testing.T) {
		tbl := e.accountsTable(t, "dl", 1, 1)
		txA, err := e.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txA.Rollback(ctx)
		connB := connect(t, ctx, e.Schema)
		txB, err := connB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txB.Rollback(ctx)
		if err := tbl.Update(ctx, txA, []any{1}, 5); err != nil {
			t.Fatal(err)
		}
		if err := tbl.Update(ctx, txB, []any{2}, 5); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- tbl.Update(ctx, txB, []any{1}, 5) }()
		waitBlocked(t, e, connB.PgConn().PID())
		errA := tbl.Update(ctx, txA, []any{2}, 5)
		var errB error
		if errA == nil {
			// B was chosen as the victim; A got the row once B aborted.
			errB = <-done
			checkRetryable(t, errB, "40P01")
		} else {
			checkRetryable(t, errA, "40P01")
			txA.Rollback(ctx)
			if errB = <-done; errB != nil {
				t.Fatalf("B after A's abort: %v", errB)
			}
		}
	})
}

func checkRetryable(t *testing.T, err error, code string) {
	t.Helper()
	if !errors.Is(err, fence.ErrRetryable) || !sqlguard.IsRetryable(err) {
		t.Fatalf("want retryable, got %v", err)
	}
	if errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("retryable error %v matches ErrStaleToken", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Fatalf("want PgError %s in %v", code, err)
	}
	var re *fence.RetryableError
	if !errors.As(err, &re) {
		t.Fatalf("want *RetryableError in %v", err)
	}
}

// TestTableHostileIdentifiers: names with quotes, semicolons and comment
// markers are quoted, not interpreted.
func TestTableHostileIdentifiers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	table := `we"ird; DROP TABLE canary; --`
	key := `i"d`
	col := `c'ol"; DELETE FROM canary; --`
	e.exec(t, `CREATE TABLE canary (x int)`)
	e.exec(t, `INSERT INTO canary VALUES (1)`)
	e.exec(t, `CREATE TABLE `+pgx.Identifier{table}.Sanitize()+` (`+pgx.Identifier{key}.Sanitize()+` int PRIMARY KEY, `+
		pgx.Identifier{col}.Sanitize()+` text, lock_version bigint NOT NULL DEFAULT 0)`)
	tbl, err := sqlguard.NewTable(e.Schema, table, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Insert(ctx, e.Pool, []any{1}, 3, sqlguard.Col(col, "'); DROP TABLE canary; --")); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Update(ctx, e.Pool, []any{1}, 4, sqlguard.Col(col, "v")); err != nil {
		t.Fatal(err)
	}
	checkOutcome(t, tbl.Upsert(ctx, e.Pool, []any{1}, 2, sqlguard.Col(col, "w")), stale, 2, 4, e.Schema+"."+table+"(i\"d=1)")
	if err := tbl.Delete(ctx, e.Pool, []any{1}, 4); err != nil {
		t.Fatal(err)
	}
	if n := e.int64Query(t, `SELECT count(*) FROM canary`); n != 1 {
		t.Fatalf("canary has %d rows", n)
	}
}

// TestTableLockStrength: a fenced Update locks its row the way a plain
// UPDATE does (FOR NO KEY UPDATE), so inserting a row that references it
// through a foreign key is not blocked.
func TestTableLockStrength(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.accountsTable(t, "parent", 1, 1)
	e.exec(t, `CREATE TABLE child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES parent (id))`)
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tbl.Update(ctx, tx, []any{1}, 5, sqlguard.Col("balance", 5)); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.Pool, func(tx2 pgx.Tx) error {
		if _, err := tx2.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		_, err := tx2.Exec(ctx, `INSERT INTO child VALUES (1, 1)`)
		return err
	})
	if err != nil {
		t.Fatalf("insert of a referencing row while the parent is fenced-updated: %v", err)
	}
}
