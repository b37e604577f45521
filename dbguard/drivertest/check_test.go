package drivertest

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
)

// On a migrated database the checks pass; each way a table or the
// toolkit's table can be unfit is found before any write, as a setup
// error naming its fix.
func TestCheckNamesEachProblem(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			ctx := testkit.Context(t)
			g, err := dbguard.New(d)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Check(ctx, db.SQL); err != nil {
				t.Errorf("Guard.Check on a migrated database = %v", err)
			}
			db.Exec(t, `CREATE TABLE good (id BIGINT PRIMARY KEY, `+lockVersionColumn(d)+`)`)
			floaty := "lock_version DOUBLE NOT NULL DEFAULT 0"
			if d == dbguard.SQLite {
				floaty = "lock_version REAL NOT NULL DEFAULT 0"
			}
			for _, c := range []struct {
				name, ddl string
				kinds     []error
				says      []string
			}{
				{"absent", "", []error{fence.ErrNoTable}, []string{"absent"}},
				{"plain", `(id BIGINT PRIMARY KEY, note TEXT)`, []error{fence.ErrNoLockVersion}, []string{"fencekit migrate add-lock-version --dialect " + d.String() + " --table plain --apply"}},
				{"floaty", `(id BIGINT PRIMARY KEY, ` + floaty + `)`, []error{fence.ErrLockVersionType}, []string{"floaty.lock_version"}},
				{"nullable", `(id BIGINT PRIMARY KEY, lock_version BIGINT UNSIGNED)`, []error{fence.ErrLockVersionType}, []string{"nullable"}},
				{"unkeyed", `(id BIGINT NOT NULL, ` + lockVersionColumn(d) + `)`, []error{fence.ErrAmbiguousKey}, []string{"CREATE UNIQUE INDEX"}},
				{"otherkey", `(code BIGINT PRIMARY KEY, ` + lockVersionColumn(d) + `)`, []error{fence.ErrNoTable}, []string{"no column id"}},
			} {
				if c.ddl != "" {
					db.Exec(t, `CREATE TABLE `+c.name+` `+c.ddl)
				}
				tbl, err := dbguard.NewTable(d, "", c.name, "id")
				if err != nil {
					t.Fatal(err)
				}
				guardtest.WantSetup(t, c.name, tbl.Check(ctx, db.SQL), c.kinds, c.says...)
			}
			good, err := dbguard.NewTable(d, "", "good", "id")
			if err != nil {
				t.Fatal(err)
			}
			if err := good.Check(ctx, db.SQL); err != nil {
				t.Errorf("Table.Check of a fit table = %v", err)
			}

			// The version table says the resource table's migration is
			// not applied.
			db.Exec(t, `DELETE FROM fencekit_goose_version WHERE version_id = 1`)
			guardtest.WantSetup(t, "Guard.Check without migration 1", g.Check(ctx, db.SQL), []error{fence.ErrNotMigrated}, "migration 00001", "fencekit migrate up --dialect "+d.String())
			// No toolkit table at all.
			db.Exec(t, `DROP TABLE fencekit_resource_tokens`)
			guardtest.WantSetup(t, "Guard.Check on a database not migrated", g.Check(ctx, db.SQL), []error{fence.ErrNotMigrated}, "fencekit migrate up --dialect "+d.String())
			guardtest.WantSetup(t, "BeginFunc on a database not migrated", g.BeginFunc(ctx, db.SQL, "job", 1, func(*sql.Tx) error { return nil }), []error{fence.ErrNotMigrated})
		})
	}
}

// A MySQL user that may not use the toolkit's table or a fenced table is
// found by the checks, each missing privilege named with its GRANT; and
// its writes are refused as setup errors, so that a retry loop stops.
func TestCheckFindsMissingPrivileges(t *testing.T) {
	t.Parallel()
	db := Open(t, dbguard.MySQL)
	ctx := testkit.Context(t)
	db.Exec(t, `CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance INT NOT NULL DEFAULT 0, `+lockVersionColumn(dbguard.MySQL)+`)`)
	db.Exec(t, `INSERT INTO accounts (id) VALUES (1)`)
	user := Unique(t, "fku_")[:30]
	db.Exec(t, `CREATE USER '`+user+`'@'%' IDENTIFIED BY 'pw'`)
	t.Cleanup(func() { db.Exec(t, `DROP USER '`+user+`'@'%'`) })
	limited := db.OpenWith(t, func(c *mysql.Config) { c.User, c.Passwd = user, "pw" }, nil)

	g, err := dbguard.New(dbguard.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := dbguard.NewTable(dbguard.MySQL, "", "accounts", "id")
	if err != nil {
		t.Fatal(err)
	}
	// With no grant at all, the database is refused.
	guardtest.WantSetup(t, "Guard.Check with no grant", g.Check(ctx, limited), nil, "Access denied")
	db.Exec(t, `GRANT SELECT (id) ON accounts TO '`+user+`'@'%'`)
	db.Exec(t, `GRANT SELECT (resource) ON fencekit_resource_tokens TO '`+user+`'@'%'`)
	guardtest.WantSetup(t, "Guard.Check", g.Check(ctx, limited), nil, "GRANT SELECT, INSERT, UPDATE ON")
	guardtest.WantSetup(t, "Table.Check", tbl.Check(ctx, limited), nil, "GRANT SELECT, UPDATE ON")
	guardtest.WantSetup(t, "Table.Update", tbl.Update(ctx, limited, []any{1}, 5, dbguard.Col("balance", 1)), nil, "denied")
	guardtest.WantSetup(t, "Guard.BeginFunc", g.BeginFunc(ctx, limited, "job", 5, func(*sql.Tx) error { return nil }), nil, "denied")

	db.Exec(t, `GRANT SELECT, UPDATE ON accounts TO '`+user+`'@'%'`)
	db.Exec(t, `GRANT SELECT, INSERT, UPDATE ON fencekit_resource_tokens TO '`+user+`'@'%'`)
	if err := g.Check(ctx, limited); err != nil {
		t.Errorf("Guard.Check after the grants = %v", err)
	}
	if err := tbl.Check(ctx, limited); err != nil {
		t.Errorf("Table.Check after the grants = %v", err)
	}
	if err := tbl.Update(ctx, limited, []any{1}, 5, dbguard.Col("balance", 1)); err != nil {
		t.Errorf("Table.Update after the grants = %v", err)
	}
}

// A SQLite database opened read-only takes no writes: the checks say so,
// naming the fix, and so do the writes.
func TestCheckFindsReadOnlySQLite(t *testing.T) {
	t.Parallel()
	db := Open(t, dbguard.SQLite)
	ctx := testkit.Context(t)
	db.Exec(t, `CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INT NOT NULL DEFAULT 0, `+lockVersionColumn(dbguard.SQLite)+`)`)
	db.Exec(t, `INSERT INTO accounts (id) VALUES (1)`)
	path := strings.TrimPrefix(strings.SplitN(db.DSN, "?", 2)[0], "file:")
	ro, err := sql.Open("sqlite", "file:"+filepath.ToSlash(path)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	g, err := dbguard.New(dbguard.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := dbguard.NewTable(dbguard.SQLite, "", "accounts", "id")
	if err != nil {
		t.Fatal(err)
	}
	guardtest.WantSetup(t, "Guard.Check", g.Check(ctx, ro), nil, "read-write")
	guardtest.WantSetup(t, "Table.Check", tbl.Check(ctx, ro), nil, "read-write")
	guardtest.WantSetup(t, "Table.Update", tbl.Update(ctx, ro, []any{1}, 5, dbguard.Col("balance", 1)), nil, "read-write")
}
