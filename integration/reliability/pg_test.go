package reliability

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// pgEnv is one test's throwaway schema, migrated, and the application name
// its connections carry (so that the chaos can find and kill them).
type pgEnv struct {
	t       testing.TB
	url     string
	schema  string
	appName string
}

func newPGEnv(t testing.TB) *pgEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := &pgEnv{t: t, url: testenv.PostgresURL(), schema: testkit.UniqueName(t, "fkrel_")}
	e.appName = e.schema
	admin := e.conn(ctx, "")
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{e.schema}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, e.url)
		if err != nil {
			t.Errorf("drop schema %s: %v", e.schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", e.schema, err)
		}
	})
	db, err := migrations.Open(e.url, e.schema)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
	return e
}

// config returns a connection configuration for the schema, through addr
// ("host:port") when it is not empty.
func (e *pgEnv) config(addr string) *pgx.ConnConfig {
	e.t.Helper()
	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		e.t.Fatalf("%s: %v", testenv.PostgresURLVar, err)
	}
	if e.schema != "" {
		cfg.RuntimeParams["search_path"] = e.schema
	}
	cfg.RuntimeParams["application_name"] = e.appName
	cfg.ConnectTimeout = 2 * time.Second
	if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.Host = host
		_, _ = fmt.Sscan(port, &cfg.Port)
		cfg.Fallbacks = nil
	}
	return cfg
}

// conn opens a connection (search_path: the schema unless searchPath is
// given), closed by the caller.
func (e *pgEnv) conn(ctx context.Context, addr string) *pgx.Conn {
	e.t.Helper()
	c, err := pgx.ConnectConfig(ctx, e.config(addr))
	if err != nil {
		e.t.Fatalf("PostgreSQL at %s: %v (run ./scripts/test.sh or set %s)", e.url, err, testenv.PostgresURLVar)
	}
	return c
}

// pool opens a pool through addr ("" for direct), closed when the test
// ends.
func (e *pgEnv) pool(addr string, maxConns int32) *pgxpool.Pool {
	e.t.Helper()
	pcfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	pcfg.ConnConfig = e.config(addr)
	pcfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := p.Ping(ctx); err != nil {
		e.t.Fatalf("PostgreSQL at %s: %v", addr, err)
	}
	e.t.Cleanup(p.Close)
	return p
}

func (e *pgEnv) exec(sql string, args ...any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := e.conn(ctx, "")
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// terminateOne kills one backend of the test's connections, other than
// the caller's, with pg_terminate_backend, and reports whether there was
// one.
func (e *pgEnv) terminateOne(ctx context.Context, admin *pgx.Conn) bool {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM (
		SELECT pid FROM pg_catalog.pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_catalog.pg_backend_pid()
		ORDER BY random() LIMIT 1) AS p`, e.appName).Scan(&n)
	return err == nil && n > 0
}

// pgUpstream is the PostgreSQL server's host:port.
func pgUpstream(t testing.TB) string {
	cfg, err := pgx.ParseConfig(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}
