package drivertest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
)

// sqliteParts is a SQLite database with the tables BenchmarkSQLiteTxParts
// and TestSQLiteFencedTxPages write, and the transactions they compare.
type sqliteParts struct {
	db  *DB
	sql *sql.DB
	ops []sqlitePart
}

// sqlitePart is one transaction: the user's write of the bench row, alone
// or with one more write before it.
type sqlitePart struct {
	name, what string
	call       func(ctx context.Context, i int) error
}

// newSQLiteParts opens a SQLite database (the harness's DSN changed by
// dsn) and prepares the transactions: "tx", a plain
// transaction writing the bench row (the user's write), and the same
// transaction with one more write, up to the fenced transaction itself.
func newSQLiteParts(tb testing.TB, dsn func(string) string) *sqliteParts {
	tb.Helper()
	db := OpenSQLite(tb)
	// A pool of its own, on the changed DSN (modernc.org/sqlite runs the
	// _pragma values sorted, not in their order: change a pragma in place
	// rather than append another); the harness's pool, which ran the
	// migrations, is closed so that one connection serves every
	// transaction.
	db.SQL.Close()
	db.DSN = dsn(db.DSN)
	pool, err := sql.Open(db.Driver, db.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pool.Close() })
	exec := func(q string) {
		tb.Helper()
		if _, err := pool.Exec(q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE bench (id BIGINT PRIMARY KEY, value TEXT, lock_version BIGINT NOT NULL DEFAULT 0)`)
	exec(`INSERT INTO bench (id) VALUES (1)`)
	exec(`CREATE TABLE side (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)`)
	exec(`INSERT INTO side (id, n) VALUES (1, 0)`)
	// The toolkit's table under other layouts: WITHOUT ROWID (one b-tree
	// instead of the rowid table and its autoindex), and an integer key.
	exec(`CREATE TABLE tokens_norowid (resource TEXT NOT NULL PRIMARY KEY, token INTEGER NOT NULL CHECK (typeof(token) = 'integer' AND token > 0), updated_at TEXT NOT NULL DEFAULT '') WITHOUT ROWID`)
	exec(`CREATE TABLE tokens_intkey (id INTEGER PRIMARY KEY, token INTEGER NOT NULL CHECK (typeof(token) = 'integer' AND token > 0))`)
	exec(`INSERT INTO fencekit_resource_tokens (resource, token) VALUES ('advance', 1)`)
	exec(`INSERT INTO tokens_norowid (resource, token) VALUES ('advance', 1)`)
	exec(`INSERT INTO tokens_intkey (id, token) VALUES (1, 1)`)
	var g *dbguard.Guard
	g, err = dbguard.New(dbguard.SQLite)
	if err != nil {
		tb.Fatal(err)
	}
	prepare := func(q string) *sql.Stmt {
		tb.Helper()
		st, err := pool.Prepare(q)
		if err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
		tb.Cleanup(func() { st.Close() })
		return st
	}
	const update = `UPDATE bench SET value = ? WHERE id = 1`
	var tok int64 = 1 // every advance is accepted
	user := func(ctx context.Context, tx *sql.Tx, i int, tag string) error {
		_, err := tx.ExecContext(ctx, update, tag+strconv.Itoa(i))
		return err
	}
	// plain runs a plain transaction: first (if not nil), then the user's
	// write, then COMMIT; pinned begins it on a Conn with a non-nil
	// *sql.TxOptions, as BeginFunc does.
	plain := func(tag string, pinned bool, first func(ctx context.Context, tx *sql.Tx, i int) error) func(ctx context.Context, i int) error {
		return func(ctx context.Context, i int) error {
			var tx *sql.Tx
			var err error
			if pinned {
				c, err := pool.Conn(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				tx, err = c.BeginTx(ctx, &sql.TxOptions{})
				if err != nil {
					return err
				}
			} else if tx, err = pool.BeginTx(ctx, nil); err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // a no-op after Commit
			if first != nil {
				if err := first(ctx, tx, i); err != nil {
					return err
				}
			}
			if err := user(ctx, tx, i, tag); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
	prepared := func(q string, args func(tok int64) []any) func(ctx context.Context, tx *sql.Tx, i int) error {
		st := prepare(q)
		return func(ctx context.Context, tx *sql.Tx, i int) error {
			tok++
			res, err := tx.StmtContext(ctx, st).ExecContext(ctx, args(tok)...)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return fmt.Errorf("%s: %d rows (%v)", q, n, err)
			}
			return nil
		}
	}
	advance := `UPDATE "fencekit_resource_tokens" SET "token" = ? WHERE "resource" = ? AND "token" <= ?`
	advArgs := func(t int64) []any { return []any{t, "advance", t} }
	var fenced fence.Token
	ops := []sqlitePart{
		{"tx", "a plain transaction writing the bench row", plain("a", false, nil)},
		{"same-page", "+ a prepared UPDATE of the same row (one more statement, no more pages)",
			plain("b", false, prepared(`UPDATE bench SET lock_version = ? WHERE id = 1`, func(t int64) []any { return []any{t} }))},
		{"2rows-prepared", "+ a prepared UPDATE of a row in another table (one more statement and page)",
			plain("c", false, prepared(`UPDATE side SET n = ? WHERE id = 1`, func(t int64) []any { return []any{t} }))},
		{"2rows", "+ the same UPDATE, not prepared (BenchmarkDBGuardPaired's tx-2rows)",
			plain("d", false, func(ctx context.Context, tx *sql.Tx, i int) error {
				_, err := tx.ExecContext(ctx, `UPDATE side SET n = ? WHERE id = 1`, i)
				return err
			})},
		{"advance", "+ the guard's advance statement, prepared, in a plain transaction",
			plain("e", false, prepared(advance, advArgs))},
		{"advance-norowid", "+ the advance on a WITHOUT ROWID copy of the toolkit's table",
			plain("f", false, prepared(`UPDATE tokens_norowid SET token = ? WHERE resource = ? AND token <= ?`, advArgs))},
		{"advance-intkey", "+ the advance on a table keyed by an integer",
			plain("g", false, prepared(`UPDATE tokens_intkey SET token = ? WHERE id = 1 AND token <= ?`, func(t int64) []any { return []any{t, t} }))},
		{"advance-pinned", "+ the advance, begun on a pinned Conn with non-nil TxOptions",
			plain("h", true, prepared(advance, advArgs))},
		{"fenced", "Guard.BeginFunc around the user's write", func(ctx context.Context, i int) error {
			fenced++
			return g.BeginFunc(ctx, pool, "bench", fenced, func(tx *sql.Tx) error { return user(ctx, tx, i, "i") })
		}},
	}
	return &sqliteParts{db: db, sql: pool, ops: ops}
}

// BenchmarkSQLiteTxParts takes BeginFunc's transaction on SQLite apart:
// each iteration runs, in a random order, a plain transaction writing one
// row ("tx") and the same transaction with one more thing the fenced one
// does, up to BeginFunc itself (see newSQLiteParts). For each it reports
// the median time ("<name>-µs") and the median over iterations of its
// time over tx's in the same iteration ("<name>/tx"). sync=NORMAL is the
// harness's WAL setting (no fsync at commit); sync=FULL syncs the WAL at
// every commit.
//
//	go test -run '^$' -bench SQLiteTxParts -count 3 -benchtime 2000x ./dbguard/drivertest
func BenchmarkSQLiteTxParts(b *testing.B) {
	for _, sync := range []string{"NORMAL", "FULL"} {
		b.Run("sync="+sync, func(b *testing.B) {
			p := newSQLiteParts(b, func(dsn string) string {
				return strings.Replace(dsn, "synchronous(NORMAL)", "synchronous("+sync+")", 1)
			})
			ctx := context.Background()
			var level int
			if err := p.sql.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&level); err != nil {
				b.Fatal(err)
			}
			if want := map[string]int{"NORMAL": 1, "FULL": 2}[sync]; level != want {
				b.Fatalf("PRAGMA synchronous is %d, want %d (%s)", level, want, sync)
			}
			times := make([][]float64, len(p.ops))
			for i := 0; b.Loop(); i++ {
				// A random order: in a fixed rotation each transaction
				// would always follow the same other one, and a
				// transaction runs faster after one that ran the same
				// statements.
				for _, j := range rand.Perm(len(p.ops)) {
					t0 := time.Now()
					if err := p.ops[j].call(ctx, i); err != nil {
						b.Fatalf("%s: %v", p.ops[j].name, err)
					}
					times[j] = append(times[j], float64(time.Since(t0)))
				}
			}
			for j, op := range p.ops {
				b.ReportMetric(pairbench.Median(times[j])/1e3, op.name+"-µs")
				if j == 0 {
					continue
				}
				ratios := make([]float64, len(times[j]))
				for k := range ratios {
					ratios[k] = times[j][k] / max(times[0][k], 1)
				}
				b.ReportMetric(pairbench.Median(ratios), op.name+"/tx")
			}
			if n := p.sql.Stats().OpenConnections; n != 1 {
				// One connection serves every transaction, so no
				// connection's page cache is dropped for another's writes.
				b.Logf("%d connections open, not 1", n)
			}
		})
	}
}

// TestSQLiteFencedTxPages checks what a fenced transaction writes on
// SQLite: the same number of pages (WAL frames) as a plain transaction
// that writes the user's row and one row in another table, and no more
// than one connection of the pool.
func TestSQLiteFencedTxPages(t *testing.T) {
	p := newSQLiteParts(t, func(dsn string) string { return dsn + "&_pragma=wal_autocheckpoint(0)" })
	ctx := context.Background()
	path := strings.TrimPrefix(p.db.DSN, "file:")
	path = path[:strings.IndexByte(path, '?')] + "-wal"
	var pageSize int64
	if err := p.sql.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	frames := func(name string) float64 {
		t.Helper()
		for _, op := range p.ops {
			if op.name != name {
				continue
			}
			if err := op.call(ctx, 0); err != nil { // a new resource's row is inserted here
				t.Fatalf("%s: %v", name, err)
			}
			if _, err := p.sql.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
				t.Fatal(err)
			}
			const n = 20
			for i := 1; i <= n; i++ {
				if err := op.call(ctx, i); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			const walHeader, frameHeader = 32, 24
			return float64(fi.Size()-walHeader) / float64(pageSize+frameHeader) / n
		}
		t.Fatalf("no transaction %q", name)
		return 0
	}
	want := map[string]float64{"tx": 1, "same-page": 1, "2rows-prepared": 2, "fenced": 2}
	for _, name := range []string{"tx", "same-page", "2rows-prepared", "fenced"} {
		if got := frames(name); got != want[name] {
			t.Errorf("%s: %.2f pages written per transaction, want %v", name, got, want[name])
		}
	}
	if n := p.sql.Stats().OpenConnections; n != 1 {
		t.Errorf("%d connections open after one transaction at a time, want 1", n)
	}
}
