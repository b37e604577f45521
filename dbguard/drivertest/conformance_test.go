package drivertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
)

var dialects = []dbguard.Dialect{dbguard.MySQL, dbguard.SQLite}

// valueColumn is a text column that keeps every byte of guardtest's values.
func valueColumn(d dbguard.Dialect) string {
	if d == dbguard.MySQL {
		return "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT ''"
	}
	return "TEXT NOT NULL DEFAULT ''"
}

// lockVersionColumn is the column migrations adds.
func lockVersionColumn(d dbguard.Dialect) string {
	if d == dbguard.MySQL {
		return "lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0"
	}
	return "lock_version INTEGER NOT NULL DEFAULT 0"
}

// TestConformanceTable runs the guard conformance suite against row-level
// fencing on each engine: a resource is one row written with Table.Update
// (a missing row is a missing target: ErrNotFound).
func TestConformanceTable(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			db.Exec(t, `CREATE TABLE conf_rows (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, `+lockVersionColumn(d)+`)`)
			tbl, err := dbguard.NewTable(d, "", "conf_rows", "id")
			if err != nil {
				t.Fatal(err)
			}
			var ids atomic.Int64
			newRow := func(t *testing.T, exists bool) guardtest.Resource {
				r := &confRow{confDB: newConfDB(t, db, "write"), tbl: tbl, id: ids.Add(1)}
				if exists {
					db.Exec(t, `INSERT INTO conf_rows (id) VALUES (?)`, r.id)
				}
				return r
			}
			cfg := guardtest.Config{
				NewResource: func(t *testing.T) guardtest.Resource { return newRow(t, true) },
				NewMissing:  func(t *testing.T) guardtest.Resource { return newRow(t, false) },
				IsMissing:   func(err error) bool { return errors.Is(err, fence.ErrNotFound) },
				CountIO:     func(r guardtest.Resource) int64 { return r.(*confRow).count() },
				Observe: func(_ *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
					return r.(*confRow).observe(o)
				},
				Check: func(ctx context.Context, r guardtest.Resource) error { return r.(*confRow).check(ctx) },
				// A row of a table without lock_version.
				NewBroken: func(t *testing.T) guardtest.Resource {
					db.Exec(t, `CREATE TABLE IF NOT EXISTS conf_plain (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`)`)
					plain, err := dbguard.NewTable(d, "", "conf_plain", "id")
					if err != nil {
						t.Fatal(err)
					}
					return &confRow{confDB: newConfDB(t, db, "write"), tbl: plain, id: ids.Add(1)}
				},
			}
			confLoseReply(d, &cfg, func(r guardtest.Resource) *confDB { return &r.(*confRow).confDB })
			guardtest.Run(t, cfg)
		})
	}
}

// TestConformanceBeginFunc runs the suite against fenced transactions: a
// resource is a resource name of Guard.BeginFunc, whose function stores
// the value in a plain table in the same transaction.
func TestConformanceBeginFunc(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			key := "VARBINARY(255)"
			if d == dbguard.SQLite {
				key = "TEXT"
			}
			db.Exec(t, `CREATE TABLE conf_values (resource `+key+` PRIMARY KEY, value `+valueColumn(d)+`)`)
			g, err := dbguard.New(d)
			if err != nil {
				t.Fatal(err)
			}
			var n atomic.Int64
			cfg := guardtest.Config{
				NewResource: func(t *testing.T) guardtest.Resource {
					return &confTx{confDB: newConfDB(t, db, "commit"), g: g, name: fmt.Sprintf("conf/%d 'x` \"y\"", n.Add(1))}
				},
				CountIO: func(r guardtest.Resource) int64 { return r.(*confTx).count() },
				Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
					c := r.(*confTx)
					var err error
					if c.g, err = dbguard.New(d, dbguard.WithObserver(o)); err != nil {
						t.Fatal(err)
					}
					return guardtest.Want{Guard: "dbguard", Class: "transaction", Op: "transaction", Resource: c.name}
				},
				Check: func(ctx context.Context, r guardtest.Resource) error { c := r.(*confTx); return c.g.Check(ctx, c.pool) },
				// A database whose toolkit table is gone.
				NewBroken: func(t *testing.T) guardtest.Resource {
					bare := Open(t, d)
					bare.Exec(t, `DROP TABLE fencekit_resource_tokens`)
					return &confTx{confDB: newConfDB(t, bare, "commit"), g: g, name: "conf/broken"}
				},
				Lacks: map[guardtest.Capability]string{
					guardtest.Missing: "BeginFunc creates a resource's token row at its first advance: no resource name is missing",
				},
			}
			confLoseReply(d, &cfg, func(r guardtest.Resource) *confDB { return &r.(*confTx).confDB })
			guardtest.Run(t, cfg)
		})
	}
}

// confLoseReply provides LoseReply on MySQL (a Wire that drops the reply)
// and declares it missing on SQLite.
func confLoseReply(d dbguard.Dialect, cfg *guardtest.Config, of func(guardtest.Resource) *confDB) {
	if d == dbguard.MySQL {
		cfg.LoseReply = func(t *testing.T, r guardtest.Resource) { of(r).wire.Arm() }
		return
	}
	if cfg.Lacks == nil {
		cfg.Lacks = map[guardtest.Capability]string{}
	}
	cfg.Lacks[guardtest.LoseReply] = "SQLite runs in the process (modernc.org/sqlite): no reply crosses a network to be lost, " +
		"and an interrupted statement is rolled back by SQLite before the call returns"
}

// confDB is a resource's own pool (four connections), through a Wire on
// MySQL and a CountingConnector on SQLite.
type confDB struct {
	db      *DB
	pool    *sql.DB
	wire    *faultnet.Wire
	counter *CountingConnector
}

func newConfDB(t *testing.T, db *DB, cut string) confDB {
	t.Helper()
	c := confDB{db: db}
	if db.Dialect == dbguard.MySQL {
		c.wire = faultnet.MySQLWire(cut)
		c.pool = db.OpenWith(t, nil, c.wire.Dial)
	} else {
		c.pool, c.counter = db.OpenCounting(t)
	}
	c.pool.SetMaxOpenConns(4)
	return c
}

func (c *confDB) count() int64 {
	if c.wire != nil {
		return c.wire.Requests.Load()
	}
	return c.counter.Calls.Load()
}

type confRow struct {
	confDB
	tbl *dbguard.Table
	id  int64
}

// observe makes the row's Table report to o, and says what its events
// carry.
func (r *confRow) observe(o fence.WriteObserver) guardtest.Want {
	r.tbl = r.tbl.WithObserver(o)
	return guardtest.Want{Guard: "dbguard", Class: "conf_rows", Op: "update", Resource: fmt.Sprintf("conf_rows(id=%d)", r.id)}
}

// check is the Table's start-up check through the row's pool.
func (r *confRow) check(ctx context.Context) error { return r.tbl.Check(ctx, r.pool) }

func (r *confRow) Write(ctx context.Context, token fence.Token, value string) error {
	return r.tbl.Update(ctx, r.pool, []any{r.id}, token, dbguard.Col("value", value))
}

func (r *confRow) Read(ctx context.Context) (string, fence.Token, error) {
	var v, lv string
	if err := r.db.SQL.QueryRowContext(ctx, `SELECT value, lock_version FROM conf_rows WHERE id = ?`, r.id).Scan(&v, &lv); err != nil {
		return "", 0, err
	}
	tok, err := strconv.ParseUint(lv, 10, 64)
	return v, fence.Token(tok), err
}

type confTx struct {
	confDB
	g    *dbguard.Guard
	name string
}

func (r *confTx) Write(ctx context.Context, token fence.Token, value string) error {
	return r.g.BeginFunc(ctx, r.pool, r.name, token, func(tx *sql.Tx) error {
		q := `INSERT INTO conf_values (resource, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)`
		if r.db.Dialect == dbguard.SQLite {
			q = `INSERT INTO conf_values (resource, value) VALUES (?, ?) ON CONFLICT (resource) DO UPDATE SET value = excluded.value`
		}
		_, err := tx.ExecContext(ctx, q, r.key(), value)
		return err
	})
}

// key is the resource name as the tables store it: bytes on MySQL.
func (r *confTx) key() any {
	if r.db.Dialect == dbguard.MySQL {
		return []byte(r.name)
	}
	return r.name
}

func (r *confTx) Read(ctx context.Context) (string, fence.Token, error) {
	var v, tok string
	err := r.db.SQL.QueryRowContext(ctx, `SELECT
		COALESCE((SELECT value FROM conf_values WHERE resource = ?), ''),
		COALESCE((SELECT token FROM fencekit_resource_tokens WHERE resource = ?), 0)`, r.key(), r.key()).Scan(&v, &tok)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	return v, fence.Token(n), err
}
