package sqlguard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/sqlguard"
)

// On a migrated schema, every check passes: the Guard's, a fenced
// table's, the ledger's.
func TestCheckPassesWhenSetUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testkit.Context(t)
	g, err := sqlguard.New(sqlguard.WithSchema(e.Schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, e.Pool); err != nil {
		t.Errorf("Guard.Check = %v", err)
	}
	if err := e.accountsTable(t, "accounts", 0, 0).Check(ctx, e.Pool); err != nil {
		t.Errorf("Table.Check = %v", err)
	}
	lg, err := sqlguard.NewLedger(e.Pool, e.Schema, sqlguard.LedgerTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.Check(ctx); err != nil {
		t.Errorf("Ledger.Check = %v", err)
	}
}

// Each way a table can be unfit for row-level fencing is found by
// Table.Check, before any write, as a setup error naming its fix.
func TestTableCheckNamesEachProblem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testkit.Context(t)
	for _, c := range []struct {
		name, ddl string
		kinds     []error
		says      []string
	}{
		{"absent", "", []error{fence.ErrNoTable}, []string{"absent"}},
		{"plain", `(id int PRIMARY KEY, note text)`, []error{fence.ErrNoLockVersion}, []string{"fencekit migrate add-lock-version --table " + e.Schema + ".plain --apply"}},
		{"floaty", `(id int PRIMARY KEY, lock_version double precision NOT NULL DEFAULT 0)`, []error{fence.ErrLockVersionType}, []string{"double precision", "bigint"}},
		{"nullable", `(id int PRIMARY KEY, lock_version bigint)`, []error{fence.ErrLockVersionType}, []string{"SET NOT NULL"}},
		{"unkeyed", `(id int NOT NULL, lock_version bigint NOT NULL DEFAULT 0)`, []error{fence.ErrAmbiguousKey}, []string{"CREATE UNIQUE INDEX"}},
		{"otherkey", `(code int PRIMARY KEY, lock_version bigint NOT NULL DEFAULT 0)`, []error{fence.ErrNoTable}, []string{"no column id"}},
	} {
		if c.ddl != "" {
			e.exec(t, `CREATE TABLE `+c.name+` `+c.ddl)
		}
		tbl, err := sqlguard.NewTable(e.Schema, c.name, "id")
		if err != nil {
			t.Fatal(err)
		}
		guardtest.WantSetup(t, c.name, tbl.Check(ctx, e.Pool), c.kinds, c.says...)
	}
}

// A schema where the migrations did not run, or one of them is not
// applied, is found by Guard.Check and Ledger.Check.
func TestCheckFindsMigrationsNotRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testkit.Context(t)
	bare := e.Schema + "_bare"
	e.exec(t, `CREATE SCHEMA `+pgx.Identifier{bare}.Sanitize())
	t.Cleanup(func() { e.exec(t, `DROP SCHEMA `+pgx.Identifier{bare}.Sanitize()+` CASCADE`) })
	g, err := sqlguard.New(sqlguard.WithSchema(bare))
	if err != nil {
		t.Fatal(err)
	}
	guardtest.WantSetup(t, "Guard.Check on a bare schema", g.Check(ctx, e.Pool), []error{fence.ErrNotMigrated}, "fencekit migrate up --schema "+bare)
	lg, err := sqlguard.NewLedger(e.Pool, bare, sqlguard.LedgerTable)
	if err != nil {
		t.Fatal(err)
	}
	guardtest.WantSetup(t, "Ledger.Check on a bare schema", lg.Check(ctx), []error{fence.ErrNotMigrated, fence.ErrLedgerTable}, "fencekit migrate up --schema "+bare)

	// The version table says that migration 2 is not applied.
	e.exec(t, `DELETE FROM fencekit_goose_version WHERE version_id = 2`)
	g, err = sqlguard.New(sqlguard.WithSchema(e.Schema))
	if err != nil {
		t.Fatal(err)
	}
	guardtest.WantSetup(t, "Guard.Check without migration 2", g.Check(ctx, e.Pool), []error{fence.ErrNotMigrated}, "migration 00002", "fencekit migrate up")
}

// A role that may not use the toolkit's objects or the fenced table is
// found by the checks, each missing privilege named with its GRANT; and
// its writes are refused as setup errors too, so that a retry loop stops.
func TestCheckFindsMissingPrivileges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testkit.Context(t)
	tbl := e.accountsTable(t, "accounts", 0, 0)
	role := testkit.UniqueName(t, "fk_role_")
	e.exec(t, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		e.exec(t, `DROP OWNED BY `+role)
		e.exec(t, `DROP ROLE `+role)
	})
	e.exec(t, `GRANT USAGE ON SCHEMA `+pgx.Identifier{e.Schema}.Sanitize()+` TO `+role)
	e.exec(t, `REVOKE EXECUTE ON FUNCTION fencekit_advance_token(text, bigint) FROM PUBLIC`)
	cfg, err := pgxpool.ParseConfig(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.ConnConfig.RuntimeParams["search_path"] = e.Schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	guardtest.WantSetup(t, "Guard.Check", g.Check(ctx, pool), nil, "SELECT, INSERT, UPDATE", "GRANT EXECUTE ON FUNCTION")
	guardtest.WantSetup(t, "Table.Check", tbl.Check(ctx, pool), nil, "GRANT SELECT, UPDATE ON")
	guardtest.WantSetup(t, "Table.Update", tbl.Update(ctx, pool, []any{1}, 5, sqlguard.Col("balance", 1)), nil, "permission denied")
	guardtest.WantSetup(t, "Guard.BeginFunc", g.BeginFunc(ctx, pool, "job", 5, func(pgx.Tx) error { return nil }), nil, "permission denied")

	e.exec(t, `GRANT SELECT, UPDATE ON accounts TO `+role)
	e.exec(t, `GRANT SELECT, INSERT, UPDATE ON fencekit_resource_tokens TO `+role)
	e.exec(t, `GRANT EXECUTE ON FUNCTION fencekit_advance_token(text, bigint) TO `+role)
	if err := g.Check(ctx, pool); err != nil {
		t.Errorf("Guard.Check after the grants = %v", err)
	}
	if err := tbl.Check(ctx, pool); err != nil {
		t.Errorf("Table.Check after the grants = %v", err)
	}
	if err := tbl.Update(context.Background(), pool, []any{1}, 5, sqlguard.Col("balance", 1)); err != nil {
		t.Errorf("Table.Update after the grants = %v", err)
	}
}
