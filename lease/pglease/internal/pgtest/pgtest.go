// Package pgtest gives destructive tests PostgreSQL servers of their own: a
// throwaway cluster made with initdb and run with pg_ctl on a free loopback
// port (restarted, paused with SIGSTOP, its backends terminated), and a
// PgBouncer in front of a server. When the tests run as root, the servers
// run as the postgres user (PostgreSQL refuses root), through runuser. It
// fails the test loudly when a server cannot be had; it never skips.
//
// The binaries are found in FENCE_PG_BIN if set, else in the newest
// /usr/lib/postgresql/*/bin (Debian's layout); PgBouncer in PATH or
// /usr/sbin (Debian: apt-get install pgbouncer; scripts/services.sh does).
package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/internal/testkit/ports"
)

// BinVar names the directory of initdb, pg_ctl and postgres.
const BinVar = "FENCE_PG_BIN"

// Cluster is a throwaway PostgreSQL server owned by one test.
type Cluster struct {
	// URL connects to its database "postgres" as user postgres (trust
	// authentication, loopback only).
	URL  string
	Port int
	Dir  string // the data directory

	t      testing.TB
	bin    string
	opts   string // pg_ctl -o
	paused []int
}

// Start makes a cluster with initdb in a new directory, starts it on a free
// loopback port with the given extra settings (name=value, passed as -c),
// waits until it accepts queries, and stops it (immediately) and removes
// the directory when the test ends.
func Start(t testing.TB, settings ...string) *Cluster {
	t.Helper()
	bin := binDir(t)
	root, err := os.MkdirTemp("", "fencekit-pg-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	c := &Cluster{t: t, bin: bin, Dir: filepath.Join(root, "data"), Port: ports.Loopback(t)}
	t.Cleanup(func() {
		c.Resume()
		_ = c.pgctl("stop", "-m", "immediate", "-w")
		_ = os.RemoveAll(root)
	})
	chownToServer(t, root)
	if out, err := c.run(filepath.Join(bin, "initdb"), "-D", c.Dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	opts := []string{
		"-p " + strconv.Itoa(c.Port),
		"-c listen_addresses=127.0.0.1",
		"-c unix_socket_directories=" + root,
		"-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
		"-c max_connections=200",
	}
	for _, s := range settings {
		opts = append(opts, "-c "+s)
	}
	c.opts = strings.Join(opts, " ")
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
	c.start()
	return c
}

// StartAgain starts a cluster stopped by Stop, on the same port and data
// directory, and waits until it accepts queries.
func (c *Cluster) StartAgain() {
	c.t.Helper()
	c.start()
}

func (c *Cluster) start() {
	c.t.Helper()
	if out, err := c.pgctlOut("start", "-w", "-t", "60", "-l", filepath.Join(filepath.Dir(c.Dir), "server.log"), "-o", c.opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(filepath.Dir(c.Dir), "server.log"))
		c.t.Fatalf("pgtest: pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	c.WaitReady()
}

// WaitReady waits until the server accepts a query (at most 60 s).
func (c *Cluster) WaitReady() {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.URL)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("pgtest: server on port %d not ready: %v", c.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Restart stops the server at once, as a crash would (pg_ctl stop -m
// immediate: every session is cut without a goodbye), and starts it again
// on the same port and data directory.
func (c *Cluster) Restart() {
	c.t.Helper()
	c.Stop()
	c.start()
}

// Stop stops the server at once (-m immediate).
func (c *Cluster) Stop() {
	c.t.Helper()
	if out, err := c.pgctlOut("stop", "-m", "immediate", "-w"); err != nil {
		c.t.Fatalf("pgtest: pg_ctl stop: %v\n%s", err, out)
	}
}

// Pause freezes the postmaster and every process it started with SIGSTOP:
// connections stay open and nothing answers, like a host that stalls.
// Resume undoes it, and so does the test's end.
func (c *Cluster) Pause() {
	c.t.Helper()
	pids := c.processes()
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			c.t.Fatalf("pgtest: SIGSTOP %d: %v", pid, err)
		}
	}
	c.paused = pids
}

// Resume continues the processes frozen by Pause.
func (c *Cluster) Resume() {
	for _, pid := range c.paused {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	c.paused = nil
}

// processes returns the postmaster's pid and its children's.
func (c *Cluster) processes() []int {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.Dir, "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("pgtest: %v", err)
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		c.t.Fatalf("pgtest: postmaster.pid: %v", err)
	}
	pids := []int{pm}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pm) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Exec runs sql on a new connection to the cluster.
func (c *Cluster) Exec(sql string, args ...any) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		c.t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		c.t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

func (c *Cluster) pgctl(args ...string) error {
	_, err := c.pgctlOut(args...)
	return err
}

func (c *Cluster) pgctlOut(args ...string) ([]byte, error) {
	return c.run(filepath.Join(c.bin, "pg_ctl"), append([]string{"-D", c.Dir}, args...)...)
}

// run runs a server binary, as the postgres user when we are root.
func (c *Cluster) run(name string, args ...string) ([]byte, error) { return runAsServer(name, args...) }

func runAsServer(name string, args ...string) ([]byte, error) {
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// chownToServer hands dir to the postgres user when we are root.
func chownToServer(t testing.TB, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("pgtest: running as root needs a postgres user to run the server: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

func binDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(BinVar); d != "" {
		return d
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	t.Fatalf("pgtest: initdb not found in /usr/lib/postgresql/*/bin; install PostgreSQL's server (Debian: apt-get install postgresql) or set %s", BinVar)
	return ""
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// PgBouncer is a PgBouncer process owned by one test.
type PgBouncer struct {
	// URL connects through the pooler to database "postgres".
	URL  string
	Port int
}

// StartPgBouncer starts PgBouncer on a free loopback port in front of the
// server at host:port (trust authentication, any database), with the given
// pool_mode ("session" or "transaction"), waits until it accepts queries,
// and stops it when the test ends.
func StartPgBouncer(t testing.TB, host string, port int, poolMode string) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bin); err != nil {
			t.Fatal("pgtest: pgbouncer not found; install it (Debian: apt-get install pgbouncer; scripts/test.sh does)")
		}
	}
	dir, err := os.MkdirTemp("", "fencekit-pgbouncer-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	chownToServer(t, dir)
	p := &PgBouncer{Port: ports.Loopback(t)}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s/users.txt
pool_mode = %s
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s/pgbouncer.log
pidfile = %s/pgbouncer.pid
`, host, port, p.Port, dir, poolMode, dir, dir)
	for name, text := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	if out, err := runAsServer(bin, "-d", filepath.Join(dir, "pgbouncer.ini")); err != nil {
		t.Fatalf("pgtest: pgbouncer: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "pgbouncer.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGTERM)
				for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
		_ = os.RemoveAll(dir)
	})
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, p.URL)
		if err == nil {
			conn.Close(ctx)
			cancel()
			return p
		}
		cancel()
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgtest: pgbouncer on port %d not ready: %v\n%s", p.Port, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
