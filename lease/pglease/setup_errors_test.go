package pglease_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/pglease"
)

// setupBound is how long a blocking Acquire may take to give up on an
// error that retrying cannot fix: "at once", with room for a loaded
// machine. It used to retry until the caller's context ended (here 60 s).
const setupBound = 10 * time.Second

// acquireFailsAtOnce runs a blocking Acquire with a long context and
// returns its error, failing t if it took longer than setupBound.
func acquireFailsAtOnce(t *testing.T, m *lease.Manager) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	l, err := m.Acquire(ctx, "setup")
	if err == nil {
		_ = l.Release(ctx)
		t.Fatal("Acquire succeeded against a store that is not set up")
	}
	if took := time.Since(start); took > setupBound {
		t.Fatalf("Acquire gave up after %v (%v); want at once", took, err)
	}
	return err
}

// Against a database whose schema has no lease tables, a blocking Acquire
// returns at once with an error naming `fencekit migrate up --schema` with
// that schema (as the guards' errors do; first CREATE SCHEMA when the
// schema does not exist), and
// Manager.Check says the same before any lease is asked for; after the
// migrations, Check passes.
func TestAcquireWithoutTheTablesFailsAtOnce(t *testing.T) {
	u := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			const missing = "fencekit_no_such_schema"
			for _, schema := range []string{emptySchema(t, u), missing} {
				m := testkit.NewManager(t, newBackend(t, newPool(t, u), pglease.WithSchema(schema), pglease.WithMode(mode)), 2*time.Second)
				for what, err := range map[string]error{"Check": m.Check(testkit.Context(t)), "Acquire": acquireFailsAtOnce(t, m)} {
					fix := "fencekit migrate up --schema " + schema
					if !errors.Is(err, lease.ErrSetup) || !errors.Is(err, pglease.ErrNotMigrated) || !strings.Contains(err.Error(), fix) {
						t.Errorf("schema %s: %s = %v; want ErrSetup and ErrNotMigrated, naming %s", schema, what, err, fix)
					}
					if schema == missing && !strings.Contains(err.Error(), "CREATE SCHEMA") {
						t.Errorf("schema %s: %s = %v; want the fix to create the schema first", schema, what, err)
					}
					if strings.Contains(err.Error(), "\n") {
						t.Errorf("schema %s: %s's error is not one line: %q", schema, what, err)
					}
					if n, m := strings.Count(err.Error(), "pglease:"), strings.Count(err.Error(), "fencekit migrate up"); n != 1 || m != 1 {
						t.Errorf("schema %s: %s's error says pglease: %d times and its fix %d times, want once each: %q", schema, what, n, m, err)
					}
				}
			}
			ok := testkit.NewManager(t, newBackend(t, newPool(t, u), pglease.WithSchema(newSchema(t, u)), pglease.WithMode(mode)), 2*time.Second)
			if err := ok.Check(testkit.Context(t)); err != nil {
				t.Fatalf("Check of a migrated schema: %v", err)
			}
		})
	}
}

// A connection string naming a database that does not exist fails at
// once, saying so, instead of being retried until the deadline.
func TestAcquireOnAMissingDatabaseFailsAtOnce(t *testing.T) {
	pu, err := url.Parse(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/fencekit_no_such_database"
	m := testkit.NewManager(t, newBackend(t, newPool(t, pu.String())), 2*time.Second)
	err = acquireFailsAtOnce(t, m)
	if !errors.Is(err, lease.ErrSetup) || !strings.Contains(err.Error(), "database does not exist") {
		t.Fatalf("Acquire on a missing database = %v; want ErrSetup saying the database does not exist", err)
	}
	if err := m.Check(testkit.Context(t)); !errors.Is(err, lease.ErrSetup) {
		t.Fatalf("Check on a missing database = %v, want ErrSetup", err)
	}
}

// A user without privileges on the lease tables: Check says so, and a
// blocking Acquire fails at once naming the grant to make.
func TestAcquireWithoutPrivilegesFailsAtOnce(t *testing.T) {
	u := testenv.PostgresURL()
	schema := newSchema(t, u)
	role := strings.ToLower(testkit.UniqueName(t, "fk_noperm_"))
	admin := connectT(t, u)
	if _, err := admin.Exec(testkit.Context(t), "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
		t.Fatalf("create role: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(ctx, u); err == nil {
			defer c.Close(ctx)
			_, _ = c.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
			_, _ = c.Exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize())
		}
	})
	// Usage of the schema, but no privilege on its tables.
	if _, err := admin.Exec(testkit.Context(t), "GRANT USAGE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatalf("grant usage: %v", err)
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = url.User(role)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			m := testkit.NewManager(t, newBackend(t, newPool(t, pu.String()), pglease.WithSchema(schema), pglease.WithMode(mode)), 2*time.Second)
			if err := m.Check(testkit.Context(t)); !errors.Is(err, lease.ErrSetup) || !strings.Contains(err.Error(), "grant") {
				t.Errorf("Check as a user without privileges = %v; want ErrSetup naming the grant", err)
			}
			if err := acquireFailsAtOnce(t, m); !errors.Is(err, lease.ErrSetup) {
				t.Errorf("Acquire as a user without privileges = %v; want ErrSetup", err)
			}
		})
	}
}

// emptySchema creates a schema without the lease tables, dropped when the
// test ends.
func emptySchema(t *testing.T, u string) string {
	t.Helper()
	schema := strings.ToLower(testkit.UniqueName(t, "pgl_empty_"))
	admin := connectT(t, u)
	if _, err := admin.Exec(testkit.Context(t), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(ctx, u); err == nil {
			defer c.Close(ctx)
			_, _ = c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		}
	})
	return schema
}
