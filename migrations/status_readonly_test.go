package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// readOnlyURL returns the test database's URL with the session read-only
// (default_transaction_read_only), and, if role is not empty, as role.
func readOnlyURL(t *testing.T, role string) string {
	t.Helper()
	u, err := testenv.ReadOnlyPostgresURL(role)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestStatusIsReadOnly: Status works on a read-only session and for a
// role that may only read, both before and after Up, and creates nothing.
func TestStatusIsReadOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema, db := newSchema(t)

	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "fkm_reader_" + hex.EncodeToString(b[:])
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + role,
		"ALTER DEFAULT PRIVILEGES IN SCHEMA " + pgx.Identifier{schema}.Sanitize() + " GRANT SELECT ON TABLES TO " + role,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		// After the schema is dropped (cleanups run last first).
		for _, stmt := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := db.ExecContext(context.Background(), stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
	})

	check := func(when string, want goose.State) {
		t.Helper()
		for _, who := range []string{"", role} {
			ro, err := migrations.Open(readOnlyURL(t, who), schema)
			if err != nil {
				t.Fatal(err)
			}
			st, err := migrations.Status(ctx, ro)
			ro.Close()
			if err != nil {
				t.Fatalf("%s, read-only session (role %q): Status: %v", when, who, err)
			}
			if len(st) == 0 {
				t.Fatalf("%s: Status lists no migrations", when)
			}
			for _, s := range st {
				if s.State != want || (want == goose.StateApplied) == s.AppliedAt.IsZero() {
					t.Errorf("%s (role %q): %s is %s at %v; want %s", when, who, s.Source.Path, s.State, s.AppliedAt, want)
				}
			}
		}
	}
	check("before Up", goose.StatePending)
	if _, _, version := objects(t, db, schema); version {
		t.Fatalf("Status created the version table %s", migrations.VersionTable)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	check("after Up", goose.StateApplied)
}
