// Package demotest runs an example program as a real process, ends it the
// way a user or the system would (a signal, a closed pipe), and checks what
// it left behind. The program is the test binary itself: its TestMain runs
// the program's main when RunMainVar is set.
package demotest

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// RunMainVar makes the test binary run the program (see the package doc).
const RunMainVar = "FENCEKIT_DEMOTEST_RUN_MAIN"

// Env is the isolated environment the program runs in: its own ledger
// directory and temporary directory, so that what a run leaves behind can
// be seen and nothing else is touched.
type Env struct {
	StateDir, TempDir string
}

// NewEnv returns a fresh environment.
func NewEnv(t *testing.T) *Env {
	t.Helper()
	return &Env{StateDir: t.TempDir(), TempDir: t.TempDir()}
}

func (e *Env) environ() []string {
	return append(os.Environ(), RunMainVar+"=1", leftover.StateDirVar+"="+e.StateDir, "TMPDIR="+e.TempDir,
		// The program starts its own S3 server (versitygw), whose
		// process and directory are part of what must not be left.
		testenv.S3EndpointVar+"=")
}

// Proc is the program running.
type Proc struct {
	Cmd    *exec.Cmd
	Lines  <-chan string // stdout, line by line; closed at its end
	Stderr *bytes.Buffer
	stdout io.ReadCloser
	exited chan error
}

// Start starts the program with args.
func (e *Env) Start(t *testing.T, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = e.environ()
	p := &Proc{Cmd: cmd, Stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = p.Stderr
	var err error
	if p.stdout, err = cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	p.Lines = lines
	go func() {
		s := bufio.NewScanner(p.stdout)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		p.exited <- nil
	})
	return p
}

// WaitFor reads stdout until a line contains want, and fails the test if
// the output ends or a minute passes first.
func (p *Proc) WaitFor(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-p.Lines:
			if !ok {
				t.Fatalf("the program's output ended before a line with %q; stderr:\n%s", want, p.Stderr)
			}
			if strings.Contains(line, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no line with %q within a minute; stderr:\n%s", want, p.Stderr)
		}
	}
}

// CloseStdout closes the reading end of the program's stdout, as the reader
// of `| head` does when it exits.
func (p *Proc) CloseStdout() { _ = p.stdout.Close() }

// Wait waits (up to two minutes) for the program to exit and returns its
// wait status.
func (p *Proc) Wait(t *testing.T) syscall.WaitStatus {
	t.Helper()
	go func() {
		for range p.Lines { // keep reading, so that it never blocks on stdout
		}
	}()
	select {
	case <-p.exited:
		p.exited <- nil
	case <-time.After(2 * time.Minute):
		t.Fatalf("the program did not exit within two minutes; stderr:\n%s", p.Stderr)
	}
	return p.Cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// Child is a process started by the program.
type Child struct {
	Pid   int
	Start uint64
	Cmd   string
}

// Children lists the program's child processes now.
func (p *Proc) Children(t *testing.T) []Child {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []Child
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 20 || f[1] != strconv.Itoa(p.Cmd.Process.Pid) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		start, _ := strconv.ParseUint(f[19], 10, 64)
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "cmdline"))
		out = append(out, Child{Pid: pid, Start: start, Cmd: strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))})
	}
	return out
}

// ExpectGone waits (up to 10 seconds) until none of children runs, and
// fails the test naming those that still do (and kills them).
func ExpectGone(t *testing.T, children []Child) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive []Child
		for _, c := range children {
			if leftover.Alive(c.Pid, c.Start) {
				alive = append(alive, c)
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, c := range alive {
				t.Errorf("process %d (%s) still runs after the program died", c.Pid, c.Cmd)
				_ = syscall.Kill(c.Pid, syscall.SIGCONT)
				_ = syscall.Kill(c.Pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leftovers lists what is left of the program's runs in env: ledger files,
// entries in the temporary directory, and which of the schemas, MariaDB
// databases, Redis keys and DynamoDB tables that a run recorded (Ledger,
// read while it ran) still exist.
type Leftovers struct {
	Ledgers, TempEntries, Schemas, MySQLDatabases, RedisKeys, DynamoTables []string
}

// Empty reports whether nothing is left.
func (l Leftovers) Empty() bool {
	return len(l.Ledgers) == 0 && len(l.TempEntries) == 0 && len(l.Schemas) == 0 && len(l.MySQLDatabases) == 0 &&
		len(l.RedisKeys) == 0 && len(l.DynamoTables) == 0
}

// Look lists what is left now of what entries name, and in env.
func (e *Env) Look(t *testing.T, entries []leftover.Entry) Leftovers {
	t.Helper()
	var l Leftovers
	l.Ledgers, _ = filepath.Glob(filepath.Join(e.StateDir, "*"))
	ents, _ := os.ReadDir(e.TempDir)
	for _, d := range ents {
		l.TempEntries = append(l.TempEntries, d.Name())
	}
	l.RedisKeys = RedisKeysIn(t, entries)
	l.DynamoTables = DynamoTablesIn(t, entries)
	l.MySQLDatabases = MySQLDatabasesIn(t, entries)
	if schemas := SchemasIn(entries); len(schemas) > 0 {
		conn := connect(t)
		defer conn.Close(context.Background())
		rows, err := conn.Query(context.Background(), `SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname = ANY($1)`, schemas)
		if err != nil {
			t.Fatal(err)
		}
		l.Schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// Ledger returns the entries of every ledger in env now: what the
// program's runs have created and not yet removed.
func (e *Env) Ledger(t *testing.T) []leftover.Entry {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(e.StateDir, "*.json"))
	var out []leftover.Entry
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var f struct{ Entries []leftover.Entry }
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("ledger %s: %v", path, err)
		}
		out = append(out, f.Entries...)
	}
	return out
}

// SchemasIn returns the names of the schemas among entries.
func SchemasIn(entries []leftover.Entry) []string {
	var out []string
	for _, e := range entries {
		if e.Kind == leftover.KindSchema {
			out = append(out, e.Name)
		}
	}
	return out
}

// RedisKeysIn returns the Redis keys among entries that still exist.
func RedisKeysIn(t *testing.T, entries []leftover.Entry) []string {
	t.Helper()
	var out []string
	for _, e := range entries {
		if e.Kind != leftover.KindRedisKeys {
			continue
		}
		opt, err := redis.ParseURL(e.URL)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(opt)
		for _, k := range e.Keys {
			if n, err := c.Exists(context.Background(), k).Result(); err != nil {
				t.Fatal(err)
			} else if n > 0 {
				out = append(out, k)
			}
		}
		_ = c.Close()
	}
	return out
}

// DynamoTablesIn returns the DynamoDB tables among entries that still
// exist.
func DynamoTablesIn(t *testing.T, entries []leftover.Entry) []string {
	t.Helper()
	var out []string
	for _, e := range entries {
		if e.Kind != leftover.KindDynamoTable {
			continue
		}
		c, closeClient := services.NewDynamoClient(e.URL)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(e.Name)})
		cancel()
		closeClient()
		var nf *types.ResourceNotFoundException
		switch {
		case errors.As(err, &nf):
		case err != nil:
			t.Fatalf("DynamoDB at %s: %v", e.URL, err)
		default:
			out = append(out, e.Name)
		}
	}
	return out
}

// MySQLDatabasesIn returns the MariaDB databases among entries that still
// exist.
func MySQLDatabasesIn(t *testing.T, entries []leftover.Entry) []string {
	t.Helper()
	var out []string
	for _, e := range entries {
		if e.Kind != leftover.KindMySQLDatabase {
			continue
		}
		db, err := sql.Open("mysql", e.URL)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?`, e.Name).Scan(&n)
		_ = db.Close()
		if err != nil {
			t.Fatalf("MariaDB (%s): %v", testenv.MySQLURLVar, err)
		}
		if n > 0 {
			out = append(out, e.Name)
		}
	}
	return out
}

// DropSchema drops schema, if it exists, with everything in it.
func DropSchema(t *testing.T, schema string) {
	t.Helper()
	conn := connect(t)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("drop schema %s: %v", schema, err)
	}
}

// DeleteKeys deletes the Redis keys of e.
func DeleteKeys(t *testing.T, e leftover.Entry) {
	t.Helper()
	opt, err := redis.ParseURL(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Del(context.Background(), e.Keys...).Err(); err != nil {
		t.Errorf("delete %v: %v", e.Keys, err)
	}
}

func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatalf("PostgreSQL at %s is needed (run scripts/test.sh): %v", testenv.PostgresURL(), err)
	}
	return conn
}

// ExpectStoppedClean checks the end of a run that was asked to stop (a
// signal, a closed stdout): p must end by itself with exit status 2 (the
// run could not be completed), not die of a signal; its children must be
// gone; and nothing in entries, the run's ledger, may be left.
func (e *Env) ExpectStoppedClean(t *testing.T, p *Proc, children []Child, entries []leftover.Entry) {
	t.Helper()
	if ws := p.Wait(t); ws.Signaled() || ws.ExitStatus() != 2 {
		t.Errorf("exit %v; want status 2 (the run could not be completed), not death by signal; stderr:\n%s", ws, p.Stderr)
	}
	ExpectGone(t, children)
	if left := e.Look(t, entries); !left.Empty() {
		t.Errorf("left behind: %+v; stderr:\n%s", left, p.Stderr)
	}
}

// ExpectSwept runs program again with args, after a run of it was killed
// leaving entries: the new run must exit 0, say that it cleaned up after
// the earlier run, and leave nothing of entries.
func (e *Env) ExpectSwept(t *testing.T, program string, entries []leftover.Entry, args ...string) {
	t.Helper()
	next := e.Start(t, args...)
	if ws := next.Wait(t); ws.ExitStatus() != 0 {
		t.Fatalf("the next run: exit %v; stderr:\n%s", ws, next.Stderr)
	}
	if !strings.Contains(next.Stderr.String(), "cleaning up after an earlier "+program+" run") {
		t.Errorf("the next run did not say it swept; stderr:\n%s", next.Stderr)
	}
	if left := e.Look(t, entries); !left.Empty() {
		t.Errorf("left behind after the next run: %+v; its stderr:\n%s", left, next.Stderr)
	}
}

// StartUntil starts the program with args (Start), waits for a line of
// its output with want (WaitFor), and returns it with what its ledger
// lists and the processes it has started by then.
func (e *Env) StartUntil(t *testing.T, want string, args ...string) (*Proc, []leftover.Entry, []Child) {
	t.Helper()
	p := e.Start(t, args...)
	p.WaitFor(t, want)
	return p, e.Ledger(t), p.Children(t)
}

// ExpectSignalledClean sends sig to p and checks that the run stops clean
// (ExpectStoppedClean).
func (e *Env) ExpectSignalledClean(t *testing.T, p *Proc, sig syscall.Signal, children []Child, entries []leftover.Entry) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	e.ExpectStoppedClean(t, p, children, entries)
}

// Kill kills p with SIGKILL, waits for it, checks that children died with
// it (ExpectGone), and returns what the killed run left of entries.
func (e *Env) Kill(t *testing.T, p *Proc, children []Child, entries []leftover.Entry) Leftovers {
	t.Helper()
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.Wait(t)
	ExpectGone(t, children)
	return e.Look(t, entries)
}

// Main is the TestMain of an example program's package: the test binary
// stands in for the program. With childVar set (the program starts its
// workers or replicas as os.Executable() with it) it runs child; with
// RunMainVar set (Env.Start) it runs run on its arguments; else the
// tests. It exits.
func Main(m *testing.M, childVar string, child func() int, run func(args []string, stdout, stderr io.Writer) int) {
	switch {
	case os.Getenv(childVar) != "":
		os.Exit(child())
	case os.Getenv(RunMainVar) != "":
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// FlagCase is a command line and what the program must answer to it: the
// exit status, and text its stdout and stderr must contain (an empty
// Stdout: stdout must be empty). It names a struct type rather than
// defining one, so that the tests' tables of cases stay one line a case
// (go vet wants the fields of another package's struct type named).
type FlagCase = struct {
	Args           []string
	Code           int
	Stdout, Stderr string
}

// CheckFlags runs run on each case's arguments and checks its answer.
func CheckFlags(t *testing.T, run func(args []string, stdout, stderr io.Writer) int, cases []FlagCase) {
	t.Helper()
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		code := run(tc.Args, &stdout, &stderr)
		okOut := strings.Contains(stdout.String(), tc.Stdout) && (tc.Stdout != "" || stdout.Len() == 0)
		if code != tc.Code || !okOut || !strings.Contains(stderr.String(), tc.Stderr) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d, stdout %q, stderr with %q",
				tc.Args, code, stdout.String(), stderr.String(), tc.Code, tc.Stdout, tc.Stderr)
		}
	}
}
