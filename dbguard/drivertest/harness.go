// Package drivertest is the test equipment of package dbguard: it opens
// the real databases the guard's tests run on (MariaDB, SQLite), with the
// drivers dbguard itself does not import, and starts private MariaDB
// servers for destructive tests. It lives in a module of its own so that
// neither driver reaches a user of dbguard. It fails the test loudly when
// a database cannot be had; it never skips.
//
// MariaDB is found at FENCE_MYSQL_URL, a go-sql-driver/mysql DSN (default
// root@tcp(127.0.0.1:3306)/test: the development machines' MariaDB 10.11,
// started or installed by scripts/services.sh ensure_mariadb); each test
// gets a throwaway database of its own there. SQLite databases are files
// in t.TempDir().
package drivertest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/internal/testkit/ports"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// DB is one test's database: a throwaway MariaDB database, or a SQLite
// file, with fencekit's migrations applied.
type DB struct {
	Dialect dbguard.Dialect
	// DSN opens it (with the driver named by Driver).
	DSN    string
	Driver string
	// Config is the parsed DSN (MySQL only), for tests that change it.
	Config *mysql.Config
	// SQL is a pool over it, closed when the test ends.
	SQL *sql.DB
}

var nonIdent = regexp.MustCompile(`[^a-z0-9]+`)

// Unique returns a lower-case identifier unique to this run and test.
func Unique(tb testing.TB, prefix string) string {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := nonIdent.ReplaceAllString(strings.ToLower(tb.Name()), "_")
	if len(name) > 30 {
		name = name[len(name)-30:]
	}
	return prefix + name + "_" + hex.EncodeToString(b[:])
}

// Open returns a fresh database of dialect d for tb.
func Open(tb testing.TB, d dbguard.Dialect) *DB {
	tb.Helper()
	if d == dbguard.MySQL {
		return OpenMySQL(tb, testenv.MySQLURL())
	}
	return OpenSQLite(tb)
}

// OpenMySQL makes a throwaway database on the server of dsn, applies
// fencekit's migrations there, and drops it when the test ends.
func OpenMySQL(tb testing.TB, dsn string) *DB {
	tb.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("drivertest: %s: %v", testenv.MySQLURLVar, err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := Unique(tb, "fk_")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("drivertest: MariaDB at %s (%s; scripts/services.sh ensure_mariadb starts it): %v", cfg.Addr, testenv.MySQLURLVar, err)
	}
	tb.Cleanup(func() {
		a, err := sql.Open("mysql", cfg.FormatDSN())
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, _ = a.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
			cancel()
			a.Close()
		}
	})
	c := cfg.Clone()
	c.DBName = name
	c.ParseTime = true
	return open(tb, &DB{Dialect: dbguard.MySQL, Driver: "mysql", DSN: c.FormatDSN(), Config: c})
}

// OpenSQLite makes a SQLite database in a file of t.TempDir(), in WAL
// mode with a 10 s busy timeout, and applies fencekit's migrations.
func OpenSQLite(tb testing.TB) *DB {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "fencekit.db")
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	return open(tb, &DB{Dialect: dbguard.SQLite, Driver: "sqlite", DSN: dsn})
}

func open(tb testing.TB, d *DB) *DB {
	tb.Helper()
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	d.SQL = db
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrations.Up(ctx, db, migrations.WithDialect(GooseDialect(d.Dialect))); err != nil {
		tb.Fatalf("drivertest: migrations: %v", err)
	}
	return d
}

// GooseDialect returns the migrations dialect of d.
func GooseDialect(d dbguard.Dialect) goose.Dialect {
	if d == dbguard.MySQL {
		return migrations.DialectMySQL
	}
	return migrations.DialectSQLite
}

// Exec runs statements on d, failing the test on error.
func (d *DB) Exec(tb testing.TB, query string, args ...any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.SQL.ExecContext(ctx, query, args...); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
}

// OpenWith opens another pool over d with the DSN changed by edit (MySQL)
// and dial as its dial function (nil: the default), closed when the test
// ends.
func (d *DB) OpenWith(tb testing.TB, edit func(*mysql.Config), dial func(ctx context.Context, network, addr string) (net.Conn, error)) *sql.DB {
	tb.Helper()
	if d.Dialect != dbguard.MySQL {
		db, err := sql.Open(d.Driver, d.DSN)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { db.Close() })
		return db
	}
	c := d.Config.Clone()
	if edit != nil {
		edit(c)
	}
	c.DialFunc = dial
	conn, err := mysql.NewConnector(c)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(conn)
	tb.Cleanup(func() { db.Close() })
	return db
}

// Server is a private MariaDB server owned by one test, for destructive
// tests (restart, kill).
type Server struct {
	// DSN connects as root to its database "test".
	DSN  string
	Port int
	Dir  string

	tb  testing.TB
	cmd *exec.Cmd
}

// StartServer installs a MariaDB data directory with mariadb-install-db in
// a temporary directory and starts mariadbd on a free loopback port; it
// kills the server and removes the directory when the test ends.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	for _, bin := range []string{"mariadb-install-db", "mariadbd"} {
		if _, err := lookBin(bin); err != nil {
			tb.Fatalf("drivertest: %s not found (Debian: apt-get install mariadb-server; scripts/services.sh ensure_mariadb): %v", bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "fencekit-mariadb-")
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{tb: tb, Dir: dir, Port: ports.Loopback(tb)}
	tb.Cleanup(func() {
		s.Kill()
		_ = os.RemoveAll(dir)
	})
	// A temporary directory of its own: servers installed or started at
	// once (test binaries run in parallel) share /tmp otherwise, and one
	// removed another's temporary table files mid-install ("Can't find
	// file: '/tmp/#sql-temptable-...'").
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		tb.Fatal(err)
	}
	install, _ := lookBin("mariadb-install-db")
	out, err := exec.Command(install, "--no-defaults", "--datadir="+filepath.Join(dir, "data"), "--tmpdir="+filepath.Join(dir, "tmp"), "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		tb.Fatalf("drivertest: mariadb-install-db: %v\n%s", err, out)
	}
	s.DSN = fmt.Sprintf("root@tcp(127.0.0.1:%d)/test", s.Port)
	s.Start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/", s.Port))
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE test"); err != nil {
		tb.Fatalf("drivertest: create database test: %v", err)
	}
	return s
}

// Start starts the server (again) and waits until it accepts connections.
func (s *Server) Start() {
	s.tb.Helper()
	bin, _ := lookBin("mariadbd")
	s.cmd = exec.Command(bin, "--no-defaults", "--datadir="+filepath.Join(s.Dir, "data"), "--tmpdir="+filepath.Join(s.Dir, "tmp"),
		fmt.Sprintf("--port=%d", s.Port), "--socket="+filepath.Join(s.Dir, "s.sock"),
		"--pid-file="+filepath.Join(s.Dir, "m.pid"), "--bind-address=127.0.0.1", "--user=root",
		"--log-error="+filepath.Join(s.Dir, "err.log"), "--innodb-buffer-pool-size=16M",
		"--innodb-log-file-size=8M", "--skip-name-resolve",
		// Durable as a production primary runs: the binary log, synced at
		// every commit, coordinates the commit. Without it InnoDB makes a
		// commit visible to other sessions before its redo is on disk, and
		// a crash (Kill) can lose a commit that other sessions have read
		// while its own client never got the answer: the reliability
		// history check saw a row read, then gone after the restart. With
		// it a commit is visible only once the binary log holds it, and
		// recovery commits what the binary log holds.
		"--log-bin="+filepath.Join(s.Dir, "binlog"), "--sync-binlog=1", "--server-id=1")
	setPdeathsig(s.cmd)
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("drivertest: start mariadbd: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port), time.Second)
		if err == nil {
			c.Close()
			db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/", s.Port))
			if err == nil {
				err = db.Ping()
				db.Close()
				if err == nil {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.Dir, "err.log"))
			s.tb.Fatalf("drivertest: mariadbd did not start: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL (a crash: InnoDB recovers committed
// transactions from its redo log at the next start) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server and starts it again on the same port and data.
func (s *Server) Restart() {
	s.Kill()
	s.Start()
}

func lookBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not in PATH, /usr/sbin or /usr/bin", name)
}

// OpenCounting opens another pool over d whose connections count the
// statements they run (see CountingConnector); for MySQL, count a Wire's
// requests instead.
func (d *DB) OpenCounting(tb testing.TB) (*sql.DB, *CountingConnector) {
	tb.Helper()
	probe, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	drv := probe.Driver()
	probe.Close()
	cc := &CountingConnector{Connector: dsnConnector{dsn: d.DSN, drv: drv}}
	db := sql.OpenDB(cc)
	tb.Cleanup(func() { db.Close() })
	return db, cc
}

type dsnConnector struct {
	dsn string
	drv driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }
