package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
)

// --row-store: where the fenced row lives. PostgreSQL (sqlguard) by
// default; MariaDB or SQLite through package dbguard. The lease, the S3
// object and the run's PostgreSQL schema (and its leases, with
// --lease-store postgres) are unchanged.
const (
	rowPostgres = "postgres"
	rowMariaDB  = "mariadb"
	rowSQLite   = "sqlite"
)

const rowStoreUsage = "where the fenced row lives: postgres (sqlguard), mariadb (dbguard: $FENCE_MYSQL_URL, a go-sql-driver DSN,\n" +
	"else root@tcp(127.0.0.1:3306)/test; a throwaway database is made there) or sqlite (dbguard: a file in a temporary directory)"

func checkRowStore(s string) error {
	switch s {
	case rowPostgres, rowMariaDB, rowSQLite:
		return nil
	}
	return fmt.Errorf("--row-store %q: want postgres, mariadb or sqlite", s)
}

// rowStoreName is the row's store as the timeline and the verdict name it.
func (c workerConfig) rowStoreName() string {
	if c.RowStore == "" {
		return rowPostgres
	}
	return c.RowStore
}

func (c workerConfig) rowDialect() dbguard.Dialect {
	if c.RowStore == rowMariaDB {
		return dbguard.MySQL
	}
	return dbguard.SQLite
}

func (c workerConfig) openRowDB() (*sql.DB, error) {
	if c.RowStore == rowMariaDB {
		return sql.Open("mysql", c.RowDSN)
	}
	return sql.Open("sqlite", c.RowDSN)
}

// setUpRowDB makes the row's database (MariaDB: a throwaway database,
// recorded in the run's ledger; SQLite: a file in a new temporary
// directory), applies fencekit's migrations, and creates the report table
// with its one row. It returns the functions that remove it all and that
// keep it (--keep).
func (sc *scenario) setUpRowDB(ctx context.Context) (drop func() error, keep func(), err error) {
	c := &sc.cfg
	keep = func() {}
	switch c.RowStore {
	case rowMariaDB:
		d, err := demo.CreateMySQLDatabase(ctx, "", c.Schema) // stalewriter_<id>: a valid database name too
		if err != nil {
			return nil, nil, err
		}
		drop, keep, c.RowDSN = d.Drop, d.Keep, d.DSN
	case rowSQLite:
		dir, err := os.MkdirTemp("", "stalewriter-sqlite-")
		if err != nil {
			return nil, nil, err
		}
		drop = func() error { return os.RemoveAll(dir) }
		c.RowDSN = "file:" + filepath.Join(dir, "report.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	}
	db, err := c.openRowDB()
	if err == nil {
		defer db.Close()
		err = sc.createRowTable(ctx, db)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", c.RowStore, errorsJoin(err, drop()))
	}
	return drop, keep, nil
}

func errorsJoin(err, other error) error {
	if other != nil {
		return fmt.Errorf("%w (cleaning up: %v)", err, other)
	}
	return err
}

func (sc *scenario) createRowTable(ctx context.Context, db *sql.DB) error {
	d := sc.cfg.rowDialect()
	gd := migrations.DialectSQLite
	ddl := `CREATE TABLE report (id TEXT PRIMARY KEY, written_by TEXT NOT NULL, token INTEGER NOT NULL, note TEXT NOT NULL)`
	if d == dbguard.MySQL {
		gd = migrations.DialectMySQL
		ddl = `CREATE TABLE report (id VARCHAR(64) PRIMARY KEY, written_by TEXT NOT NULL, token BIGINT UNSIGNED NOT NULL, note TEXT NOT NULL)`
	}
	if _, err := migrations.Up(ctx, db, migrations.WithDialect(gd)); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Name: "report"}, migrations.WithDialect(gd)); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `INSERT INTO report (id, written_by, token, note) VALUES (?, '', 0, 'not written yet')`, sc.cfg.RowID)
	return err
}

// writeRowDB is writeRow for MariaDB and SQLite: a fenced transaction on
// the resource with a fenced row update inside it (dbguard), or a plain
// UPDATE with --unguarded.
func writeRowDB(ctx context.Context, cfg workerConfig, tok fence.Token, note string) error {
	db, err := cfg.openRowDB()
	if err != nil {
		return err
	}
	defer db.Close()
	if cfg.Unguarded {
		_, err := db.ExecContext(ctx, `UPDATE report SET written_by = ?, token = ?, note = ? WHERE id = ?`, cfg.Role, uint64(tok), note, cfg.RowID)
		return err
	}
	d := cfg.rowDialect()
	guard, err := dbguard.New(d)
	if err != nil {
		return err
	}
	table, err := dbguard.NewTable(d, "", "report", "id")
	if err != nil {
		return err
	}
	return guard.BeginFunc(ctx, db, cfg.Resource, tok, func(tx *sql.Tx) error {
		return table.Update(ctx, tx, []any{cfg.RowID}, tok,
			dbguard.Col("written_by", cfg.Role), dbguard.Col("token", uint64(tok)), dbguard.Col("note", note))
	})
}

// readFinalDB reads the row's final state from MariaDB or SQLite.
func (sc *scenario) readFinalDB(ctx context.Context, f *finalState) error {
	db, err := sc.cfg.openRowDB()
	if err != nil {
		return err
	}
	defer db.Close()
	var tok, lv string
	if err := db.QueryRowContext(ctx, `SELECT written_by, token, lock_version FROM report WHERE id = ?`, sc.cfg.RowID).
		Scan(&f.RowWrittenBy, &tok, &lv); err != nil {
		return err
	}
	t, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return err
	}
	v, err := strconv.ParseInt(lv, 10, 64)
	if err != nil {
		return err
	}
	f.RowToken, f.RowLockVersion, f.RowStore = fence.Token(t), v, sc.cfg.RowStore
	return nil
}
