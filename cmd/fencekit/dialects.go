package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/fencekit/fencekit/migrations"
)

// MySQL/MariaDB and SQLite (package dbguard): --dialect mysql takes a
// go-sql-driver/mysql DSN (default $FENCE_MYSQL_URL), --dialect sqlite a
// modernc.org/sqlite file name or DSN. The command is a program, so it may
// link every driver; the library modules each bring only their own.

const mysqlURLVar = "FENCE_MYSQL_URL"

// sqlDialect returns goose's dialect for --dialect, or an error.
func sqlDialect(name string) (goose.Dialect, error) {
	switch name {
	case "", "postgres", "postgresql":
		return goose.DialectPostgres, nil
	case "mysql", "mariadb":
		return migrations.DialectMySQL, nil
	case "sqlite", "sqlite3":
		return migrations.DialectSQLite, nil
	}
	return "", fmt.Errorf("unknown --dialect %q (postgres, mysql or sqlite)", name)
}

// openSQL opens and pings a MySQL or SQLite database.
func openSQL(ctx context.Context, dialect goose.Dialect, dsn string) (*sql.DB, error) {
	driver := "mysql"
	if dialect == migrations.DialectSQLite {
		driver = "sqlite"
		if !strings.HasPrefix(dsn, "file:") {
			dsn = "file:" + dsn
		}
		if !strings.Contains(dsn, "busy_timeout") {
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			dsn += sep + "_pragma=busy_timeout(10000)"
		}
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("bad %s DSN: %w", dialect, err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("cannot connect to the %s database: %w", dialect, err)
	}
	return db, nil
}

// splitTable splits db.table at its first dot (MySQL: database.table;
// SQLite: schema.table); names are used exactly, without SQL quoting.
func splitTable(s string) (db, table string) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "", s
}

// runSQLDialect runs a migrate subcommand on MySQL or SQLite.
func runSQLDialect(ctx context.Context, sub string, dialect goose.Dialect, db *sql.DB, to int64, table, out string, apply bool, w io.Writer) error {
	d := migrations.WithDialect(dialect)
	switch sub {
	case "up":
		res, err := migrations.Up(ctx, db, d)
		for _, r := range res {
			fmt.Fprintln(w, r)
		}
		if err == nil && len(res) == 0 {
			fmt.Fprintln(w, "fencekit migrations are up to date")
		}
		return err
	case "down":
		res, err := migrations.DownTo(ctx, db, to, d)
		for _, r := range res {
			fmt.Fprintln(w, r)
		}
		return err
	case "status":
		st, err := migrations.Status(ctx, db, d)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "fencekit migrations on %s (version table %s):\n", dialect, migrations.VersionTable)
		for _, s := range st {
			fmt.Fprintf(w, "  %-8s %s\n", s.State, s.Source.Path)
		}
		return nil
	case "add-lock-version":
		dbName, name := splitTable(table)
		tbl := migrations.TableName{Schema: dbName, Name: name}
		text, err := migrations.LockVersionMigration(tbl, d)
		if err != nil {
			return err
		}
		if out != "" {
			path, err := migrations.WriteLockVersionMigration(out, tbl, time.Now(), d)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "wrote %s\n", path)
		}
		if apply {
			if err := migrations.ApplyLockVersion(ctx, db, tbl, d); err != nil {
				return err
			}
			fmt.Fprintf(w, "%s has lock_version (added if it was missing; existing rows start at 0)\n", table)
		}
		if out == "" && !apply {
			fmt.Fprint(w, text)
		}
		return nil
	}
	return fmt.Errorf("unknown subcommand %q", sub)
}

// runOtherDialect checks the flags of a MySQL or SQLite run, opens the
// database and runs the subcommand.
func runOtherDialect(ctx context.Context, sub string, dialect goose.Dialect, c *common, getenv func(string) string,
	to int64, tables tableList, out string, apply, offline bool, stdout, stderr io.Writer) int {
	url := c.url
	if !c.urlSet {
		url = ""
		if dialect == migrations.DialectMySQL {
			url = getenv(mysqlURLVar)
		}
	}
	switch {
	case url == "" && (sub != "add-lock-version" || apply || !offline):
		fmt.Fprintf(stderr, "fencekit migrate %s: no database: pass --database-url%s\n", sub,
			map[bool]string{true: " or set " + mysqlURLVar, false: ""}[dialect == migrations.DialectMySQL])
		return exitUsage
	case sub == "add-lock-version" && len(tables) == 0:
		fmt.Fprintf(stderr, "fencekit migrate %s: --table is required\n", sub)
		return exitUsage
	case offline && apply:
		fmt.Fprintf(stderr, "fencekit migrate %s: --offline cannot be used with --apply\n", sub)
		return exitUsage
	case c.schema != "":
		fmt.Fprintf(stderr, "fencekit migrate %s: --schema is for PostgreSQL; with --dialect %s the DSN names the database\n", sub, c.dialect)
		return exitUsage
	case c.timeout <= 0:
		fmt.Fprintf(stderr, "fencekit migrate %s: --timeout must be positive\n", sub)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var db *sql.DB
	if sub != "add-lock-version" || !offline {
		var err error
		if db, err = openSQL(ctx, dialect, url); err != nil {
			fmt.Fprintf(stderr, "fencekit migrate %s: %v\n", sub, err)
			return exitFail
		}
		defer db.Close()
	}
	if sub != "add-lock-version" {
		tables = tableList{""}
	}
	for _, table := range tables {
		if err := runSQLDialect(ctx, sub, dialect, db, to, table, out, apply, stdout); err != nil {
			fmt.Fprintf(stderr, "fencekit migrate %s: %v\n", sub, err)
			return exitFail
		}
	}
	return exitOK
}
