package demo

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// MySQLURLVar names the environment variable that holds the go-sql-driver
// DSN of the MariaDB (or MySQL) server the demos use; DefaultMySQLURL is
// used when it is empty: the development machines' MariaDB 10.11 (Debian
// 12 has no Oracle MySQL server; MariaDB stands in for it).
const (
	MySQLURLVar     = testenv.MySQLURLVar
	DefaultMySQLURL = testenv.DefaultMySQLURL
)

// MySQLDatabase is a database of the run's own on a MariaDB or MySQL
// server.
type MySQLDatabase struct {
	Name string
	// DSN opens the database (go-sql-driver/mysql).
	DSN string
	// Addr is the server's address, for the demo's output.
	Addr string

	admin *sql.DB
	done  func() // strikes the database off the run's ledger
}

var databaseName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// CreateMySQLDatabase creates the database name (lower-case letters,
// digits and underscores; the leftover sweep drops only the names the
// programs use, program_xxxxxxxx) on the server of the DSN url (empty:
// $FENCE_MYSQL_URL, else DefaultMySQLURL). The database is recorded in the
// run's ledger (package leftover) before it exists, so that a run killed
// at any point leaves it to the next run's sweep. ctx bounds the
// statement.
func CreateMySQLDatabase(ctx context.Context, url, name string) (*MySQLDatabase, error) {
	if !databaseName.MatchString(name) {
		return nil, fmt.Errorf("database name %q: want lower-case letters, digits and underscores", name)
	}
	if url == "" {
		url = os.Getenv(MySQLURLVar)
	}
	if url == "" {
		url = DefaultMySQLURL
	}
	mc, err := mysql.ParseDSN(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", MySQLURLVar, err)
	}
	admin, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		return nil, err
	}
	done := leftover.Track(leftover.Entry{Kind: leftover.KindMySQLDatabase, URL: mc.FormatDSN(), Name: name})
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		done()
		return nil, fmt.Errorf("MariaDB at %s (set %s, or start it: . scripts/services.sh && ensure_mariadb): %w", mc.Addr, MySQLURLVar, err)
	}
	mc.DBName = name
	return &MySQLDatabase{Name: name, DSN: mc.FormatDSN(), Addr: mc.Addr, admin: admin, done: done}, nil
}

// Drop drops the database with everything in it and closes the
// connection. It has its own timeout, so that it can run after the run's
// context ended.
func (d *MySQLDatabase) Drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	defer d.admin.Close()
	if _, err := d.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+d.Name); err != nil {
		return fmt.Errorf("drop database %s: %w", d.Name, err)
	}
	d.done()
	return nil
}

// Keep leaves the database in place (--keep): it strikes it off the run's
// ledger and closes the connection.
func (d *MySQLDatabase) Keep() {
	d.done()
	_ = d.admin.Close()
}
