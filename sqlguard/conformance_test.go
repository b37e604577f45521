package sqlguard_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestConformanceTable runs the guard conformance suite against
// row-level fencing: a resource is one row of a table with a
// lock_version column, written with Table.Update (so a missing row is a
// missing target: ErrNotFound).
func TestConformanceTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE conf_rows (id bigint PRIMARY KEY, value text NOT NULL DEFAULT '',
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`)
	tbl, err := sqlguard.NewTable("", "conf_rows", "id")
	if err != nil {
		t.Fatal(err)
	}
	var ids atomic.Int64
	newRow := func(t *testing.T, exists bool) guardtest.Resource {
		r := &confRow{confDB: newConfDB(t, e, "UPDATE 1"), tbl: tbl, id: ids.Add(1)}
		if exists {
			e.exec(t, `INSERT INTO conf_rows (id) VALUES ($1)`, r.id)
		}
		return r
	}
	cfg := guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource { return newRow(t, true) },
		NewMissing:  func(t *testing.T) guardtest.Resource { return newRow(t, false) },
		IsMissing:   func(err error) bool { return errors.Is(err, fence.ErrNotFound) },
		CountIO:     func(r guardtest.Resource) int64 { return r.(*confRow).wire.Requests.Load() },
		LoseReply:   func(t *testing.T, r guardtest.Resource) { r.(*confRow).wire.Arm() },
		Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
			c := r.(*confRow)
			c.tbl = c.tbl.WithObserver(o)
			return guardtest.Want{Guard: "sqlguard", Class: "conf_rows", Op: "update", Resource: fmt.Sprintf("conf_rows(id=%d)", c.id)}
		},
		Check: func(ctx context.Context, r guardtest.Resource) error {
			c := r.(*confRow)
			return c.tbl.Check(ctx, c.pool)
		},
		// A row of a table without lock_version.
		NewBroken: func(t *testing.T) guardtest.Resource {
			e.exec(t, `CREATE TABLE IF NOT EXISTS conf_plain (id bigint PRIMARY KEY, value text NOT NULL DEFAULT '')`)
			plain, err := sqlguard.NewTable("", "conf_plain", "id")
			if err != nil {
				t.Fatal(err)
			}
			return &confRow{confDB: newConfDB(t, e, "UPDATE 1"), tbl: plain, id: ids.Add(1)}
		},
	}
	confLacks(e, &cfg)
	guardtest.Run(t, cfg)
}

// TestConformanceBeginFunc runs the guard conformance suite against
// fenced transactions: a resource is a resource name of Guard.BeginFunc,
// whose function stores the value in a plain table in the same
// transaction. A resource name needs no creating, so there is no missing
// target.
func TestConformanceBeginFunc(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE conf_values (resource text PRIMARY KEY, value text NOT NULL)`)
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	cfg := guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource {
			return &confTx{confDB: newConfDB(t, e, "COMMIT"), g: g, name: fmt.Sprintf("conf/%d 'x'", n.Add(1))}
		},
		CountIO:   func(r guardtest.Resource) int64 { return r.(*confTx).wire.Requests.Load() },
		LoseReply: func(t *testing.T, r guardtest.Resource) { r.(*confTx).wire.Arm() },
		Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
			c := r.(*confTx)
			var err error
			if c.g, err = sqlguard.New(sqlguard.WithObserver(o)); err != nil {
				t.Fatal(err)
			}
			return guardtest.Want{Guard: "sqlguard", Class: "transaction", Op: "transaction", Resource: c.name}
		},
		Check: func(ctx context.Context, r guardtest.Resource) error { c := r.(*confTx); return c.g.Check(ctx, c.pool) },
		// A Guard that looks in a schema where the migrations did not run.
		NewBroken: func(t *testing.T) guardtest.Resource {
			bare := e.Schema + "_bare"
			e.exec(t, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{bare}.Sanitize())
			t.Cleanup(func() { e.exec(t, `DROP SCHEMA IF EXISTS `+pgx.Identifier{bare}.Sanitize()+` CASCADE`) })
			g, err := sqlguard.New(sqlguard.WithSchema(bare))
			if err != nil {
				t.Fatal(err)
			}
			return &confTx{confDB: newConfDB(t, e, "COMMIT"), g: g, name: fmt.Sprintf("conf/%d 'x'", n.Add(1))}
		},
		Lacks: map[guardtest.Capability]string{
			guardtest.Missing: "BeginFunc creates a resource's token row at its first advance: no resource name is missing",
		},
	}
	confLacks(e, &cfg)
	guardtest.Run(t, cfg)
}

// confLacks declares LoseReply missing where the test cannot read the
// server's replies (TLS).
func confLacks(e *env, cfg *guardtest.Config) {
	pc, err := pgx.ParseConfig(e.URL)
	if err == nil && pc.TLSConfig == nil {
		return
	}
	cfg.LoseReply = nil
	if cfg.Lacks == nil {
		cfg.Lacks = map[guardtest.Capability]string{}
	}
	cfg.Lacks[guardtest.LoseReply] = "FENCE_POSTGRES_URL uses TLS: the test cannot see which reply to lose"
}

// confDB is a resource's own pool (four connections, so that concurrent
// writers use several), dialled through a faultnet.PGWire.
type confDB struct {
	e    *env
	wire *faultnet.Wire
	pool *pgxpool.Pool
}

func newConfDB(t *testing.T, e *env, cutTag string) confDB {
	t.Helper()
	w := faultnet.PGWire(cutTag)
	cfg, err := pgxpool.ParseConfig(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = e.Schema
	cfg.ConnConfig.DialFunc = w.Dial
	cfg.MaxConns = 4
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return confDB{e: e, wire: w, pool: p}
}

// confRow is one row of conf_rows.
type confRow struct {
	confDB
	tbl *sqlguard.Table
	id  int64
}

func (r *confRow) Write(ctx context.Context, token fence.Token, value string) error {
	return r.tbl.Update(ctx, r.pool, []any{r.id}, token, sqlguard.Col("value", value))
}

func (r *confRow) Read(ctx context.Context) (string, fence.Token, error) {
	var v string
	var lv int64
	err := r.e.Pool.QueryRow(ctx, `SELECT value, lock_version FROM conf_rows WHERE id = $1`, r.id).Scan(&v, &lv)
	return v, fence.Token(lv), err
}

// confTx is one resource name of a Guard.
type confTx struct {
	confDB
	g    *sqlguard.Guard
	name string
}

func (r *confTx) Write(ctx context.Context, token fence.Token, value string) error {
	return r.g.BeginFunc(ctx, r.pool, r.name, token, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO conf_values (resource, value) VALUES ($1, $2)
			ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value`, r.name, value)
		return err
	})
}

func (r *confTx) Read(ctx context.Context) (string, fence.Token, error) {
	var v string
	var tok int64
	err := r.e.Pool.QueryRow(ctx, `SELECT
		coalesce((SELECT value FROM conf_values WHERE resource = $1), ''),
		coalesce((SELECT token FROM fencekit_resource_tokens WHERE resource = $1), 0)`, r.name).Scan(&v, &tok)
	return v, fence.Token(tok), err
}
