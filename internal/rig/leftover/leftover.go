// Package leftover makes the example programs leave nothing behind, however
// they end.
//
// Two mechanisms cover the two kinds of things a run creates:
//
//   - Processes (worker processes, servers the program started) are started
//     with Start, which sets Linux's parent-death signal on them: the kernel
//     sends them the signal when the program dies, even by SIGKILL. The
//     signal is tied to the thread that forked the child, not to the
//     process, so Start forks every child from one goroutine locked to its
//     OS thread for the life of the program (a Go thread otherwise may exit
//     while the child lives, and the child would get the signal then).
//   - Everything else (a PostgreSQL schema, a MariaDB database, Redis
//     keys, a temporary directory, an S3 object) is written to a ledger,
//     one JSON file per run in the user cache directory, as it is
//     created, and struck off when it is removed. A run that ends normally removes its ledger. A
//     run that was killed leaves its ledger behind, and the next run of any
//     example program sweeps it at its start (Begin): it stops what is
//     still running of it and removes the rest.
//
// The ledger directory is $FENCEKIT_STATE_DIR if set, else
// $XDG_CACHE_HOME/fencekit/runs (~/.cache/fencekit/runs). Its files are
// readable by the user only: they hold the services' addresses.
package leftover

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StateDirVar names the environment variable that overrides the ledger
// directory.
const StateDirVar = "FENCEKIT_STATE_DIR"

// Kinds of ledger entries.
const (
	KindProcess   = "process"    // Pid, Start: a child process
	KindDir       = "dir"        // Path: a temporary directory
	KindSchema    = "schema"     // URL, Name: a PostgreSQL schema
	KindRedisKeys = "redis-keys" // URL, Keys: keys in Redis
	KindS3Object  = "s3-object"  // URL (endpoint), Bucket, Name (key), Access, Secret
	// KindDynamoTable is a DynamoDB table of the run's own: URL (endpoint),
	// Name (table). The sweep deletes the whole table.
	KindDynamoTable = "dynamodb-table"
	// KindMySQLDatabase is a MariaDB or MySQL database of the run's own:
	// URL (a go-sql-driver DSN of the server), Name (the database). The
	// sweep drops the whole database.
	KindMySQLDatabase = "mysql-database"
)

// Entry is one thing a run created.
type Entry struct {
	ID   int    `json:"id"`
	Kind string `json:"kind"`
	// Pid and Start (the process's start time in clock ticks since boot,
	// from /proc) identify a process; Start guards against a reused pid.
	Pid   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// Path is a directory.
	Path string `json:"path,omitempty"`
	// URL is the server's address; Name the schema or object key.
	URL  string   `json:"url,omitempty"`
	Name string   `json:"name,omitempty"`
	Keys []string `json:"keys,omitempty"`
	// Bucket, Access and Secret locate an S3 object.
	Bucket string `json:"bucket,omitempty"`
	Access string `json:"access,omitempty"`
	Secret string `json:"secret,omitempty"`
	// Ephemeral says that the server at URL is one the run started
	// itself: when it no longer answers, it is gone, and the entry with it.
	Ephemeral bool `json:"ephemeral,omitempty"`
}

func (e Entry) String() string {
	switch e.Kind {
	case KindProcess:
		return fmt.Sprintf("process %d", e.Pid)
	case KindDir:
		return "directory " + e.Path
	case KindSchema:
		return "schema " + e.Name
	case KindRedisKeys:
		return "Redis keys " + strings.Join(e.Keys, ", ")
	case KindS3Object:
		return fmt.Sprintf("object s3://%s/%s", e.Bucket, e.Name)
	case KindDynamoTable:
		return fmt.Sprintf("DynamoDB table %s at %s", e.Name, e.URL)
	case KindMySQLDatabase:
		return "MariaDB database " + e.Name
	}
	return e.Kind
}

// ledgerFile is the ledger's content.
type ledgerFile struct {
	Program string    `json:"program"`
	Pid     int       `json:"pid"`
	Start   uint64    `json:"start"`
	Created time.Time `json:"created"`
	Entries []Entry   `json:"entries"`
}

// Run is the ledger of this process's run.
type Run struct {
	mu     sync.Mutex
	path   string
	f      ledgerFile
	nextID int
}

var (
	activeMu sync.Mutex
	active   *Run
)

// Dir returns the ledger directory.
func Dir() (string, error) {
	if d := os.Getenv(StateDirVar); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "fencekit", "runs"), nil
}

// Begin sweeps what earlier runs that did not finish left behind (see
// Sweep), then starts this process's ledger for program and makes it the
// one Track and Start record in. logf receives one line per thing swept.
// The caller calls End when the run is over.
func Begin(ctx context.Context, program string, logf func(string, ...any)) (*Run, error) {
	Sweep(ctx, logf)
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	pid := os.Getpid()
	start, _ := processStart(pid)
	r := &Run{
		path: filepath.Join(dir, fmt.Sprintf("%s-%d-%d.json", program, pid, start)),
		f:    ledgerFile{Program: program, Pid: pid, Start: start, Created: time.Now().UTC()},
	}
	if err := r.save(); err != nil {
		return nil, err
	}
	activeMu.Lock()
	active = r
	activeMu.Unlock()
	return r, nil
}

// End ends the run's ledger. When every entry was struck off (removed, or
// kept on purpose), the ledger file is removed; otherwise it stays for the
// next run's sweep to finish the job.
func (r *Run) End() {
	activeMu.Lock()
	if active == r {
		active = nil
	}
	activeMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.f.Entries) == 0 {
		_ = os.Remove(r.path)
	}
}

// Entries returns the entries not struck off yet.
func (r *Run) Entries() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Entry(nil), r.f.Entries...)
}

// Path is the ledger file's path.
func (r *Run) Path() string { return r.path }

func (r *Run) save() error {
	b, err := json.MarshalIndent(r.f, "", "  ")
	if err != nil {
		return err
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.path)
}

// Track records e in the ledger of the current run, if there is one, and
// returns a function that strikes it off once it is removed (or kept on
// purpose). Without a current run (a test calling a package directly) it
// records nothing.
func Track(e Entry) (done func()) {
	activeMu.Lock()
	r := active
	activeMu.Unlock()
	if r == nil {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	e.ID = r.nextID
	r.f.Entries = append(r.f.Entries, e)
	_ = r.save()
	id := e.ID
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, x := range r.f.Entries {
			if x.ID == id {
				r.f.Entries = append(r.f.Entries[:i], r.f.Entries[i+1:]...)
				_ = r.save()
				return
			}
		}
	}
}

// Start starts cmd with the parent-death signal sig (SIGKILL for a worker,
// a server's own shutdown signal for a server), forking it from the one
// goroutine locked to its OS thread (see the package doc), and records it
// in the current run's ledger. Other fields of cmd.SysProcAttr are kept.
// The returned function strikes the process off once it has been waited
// for.
func Start(cmd *exec.Cmd, sig syscall.Signal) (done func(), err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	reply := make(chan error, 1)
	spawnOnce.Do(startSpawner)
	spawns <- spawnRequest{cmd: cmd, reply: reply}
	if err := <-reply; err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	start, _ := processStart(pid)
	return Track(Entry{Kind: KindProcess, Pid: pid, Start: start}), nil
}

type spawnRequest struct {
	cmd   *exec.Cmd
	reply chan error
}

var (
	spawnOnce sync.Once
	spawns    = make(chan spawnRequest)
)

// startSpawner starts the goroutine that forks every child. It never
// unlocks its thread and never returns, so the thread that is every
// child's parent lives as long as the process.
func startSpawner() {
	go func() {
		runtime.LockOSThread()
		for req := range spawns {
			req.reply <- req.cmd.Start()
		}
	}()
}

// processStart returns the start time of process pid in clock ticks since
// boot (field 22 of /proc/PID/stat), and whether the process exists and is
// not a zombie.
func processStart(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false
	}
	return start, f[0] != "Z" && f[0] != "X"
}

// Alive reports whether the process pid that started at start (as in
// Entry.Start) is still running: it exists, is not a zombie, and is the
// same process (its start time matches).
func Alive(pid int, start uint64) bool {
	s, running := processStart(pid)
	return running && (start == 0 || s == start)
}

// ErrUnsafePath is returned by the sweep for a directory entry it refuses to
// remove: one that is not a fencekit-* directory in the temporary
// directory.
var ErrUnsafePath = errors.New("leftover: refusing to remove a directory that is not a fencekit temporary directory")

// safeDir reports whether path is a directory the programs create: a
// fencekit-* directory directly in the temporary directory.
func safeDir(path string) bool {
	return filepath.Dir(path) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(path), "fencekit-")
}

// schemaName is what the programs name their schemas.
var schemaName = regexp.MustCompile(`^(stalewriter|invoicejob)_[0-9a-f]{8}$`)

// dynamoTableName is what the programs name their DynamoDB tables: the
// sweep deletes no other table.
var dynamoTableName = regexp.MustCompile(`^(stalewriter|invoicejob)-[0-9a-f]{8}$`)

// mysqlDatabaseName is what the programs name their MariaDB databases: the
// sweep drops no other database.
var mysqlDatabaseName = regexp.MustCompile(`^(stalewriter|settleorders)_[0-9a-f]{8}$`)
