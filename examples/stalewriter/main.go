// Command stalewriter shows, with real processes and real stores, why a
// lease alone cannot protect a write and how fencing tokens do.
//
// It runs the scenario of Kleppmann's critique of Redis locks ("How to do
// distributed locking", 2016):
//
//  1. worker A acquires a lease in Redis (or PostgreSQL, etcd, ZooKeeper:
//     --lease-store) and gets fencing token N;
//  2. A checks that its lease is valid and starts writing; right then it is
//     frozen with SIGSTOP, as a stop-the-world GC or a suspended VM would
//     freeze it, longer than the TTL (its heartbeat freezes with it);
//  3. the lease expires; worker B acquires it with a greater token (tokens
//     are large numbers minted from the Redis server clock) and writes a
//     row in PostgreSQL (a fenced pgx transaction on a table with
//     lock_version) and an object in S3 (blobguard);
//  4. A is resumed (SIGCONT) and, still believing it holds the lease,
//     writes the same row and object with token N;
//  5. both of A's writes are rejected as stale; B's data survives.
//
// It prints a timeline and a verdict computed from what happened (see
// verdict.go): who held which token when, and what each store answered to
// each write. Timing decides the story: a pause shorter than the lease's
// remaining validity lets A keep its lease; a write A sends after losing
// its lease is rejected if B has written there already, and accepted (B's
// write then replaces it) if B has not, which the verdict says plainly. It
// exits 0 when no stale write landed after a newer one and the final state
// belongs to the newest token. With --unguarded the same timeline uses
// plain SQL and plain PUT: A's write overwrites B's, and the program exits
// 1 saying why.
//
// Services come from the environment (FENCE_REDIS_URL, FENCE_POSTGRES_URL,
// FENCE_S3_*, FENCE_ETCD_ENDPOINTS, FENCE_ZK_SERVERS), else the default
// local addresses, else servers it starts itself (versitygw and etcd are
// built once into the user cache; ZooKeeper runs from Debian's package),
// else Docker through testcontainers-go. Everything it creates is removed at the end, however
// the run ends: the processes it starts die with it, even by SIGKILL, and
// what a killed run leaves in the stores is removed by the next run
// (package examples/internal/leftover).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/examples/internal/leftover"
	"github.com/fencekit/fencekit/examples/services"
	"github.com/fencekit/fencekit/fence"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(runWorker())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	ttl, pause, writeDelay time.Duration
	unguarded, keep        bool
	dynamodb               bool
	leaseStore             string
	rowStore               string
	redisURL, pgURL, s3URL string
	jsonOut                string
	downstream             bool // --downstream: see downstream.go
}

// Bounds of the timing flags: a demo that runs for hours, or whose default
// pause overflows, helps nobody.
const (
	minTTL, maxTTL               = 100 * time.Millisecond, time.Minute
	maxPause                     = 10 * time.Minute
	minWriteDelay, maxWriteDelay = 50 * time.Millisecond, 10 * time.Second
)

const usageText = `Usage: go run ./examples/stalewriter [flags]

Runs the paused-client scenario with two real worker processes, a lease
store (Redis; or PostgreSQL, etcd, ZooKeeper or DynamoDB with --lease-store),
PostgreSQL and S3 (and a DynamoDB item with --dynamodb), and shows the stale
write rejected by the stores.
Exit status: 0 when every stale write was rejected and the newest token's data
survived; 1 when a stale write landed (expected with --unguarded); 2 when the
run could not be carried out (a service is missing, a bad flag, a write that
failed for another reason than a stale token).

Flags:
`

// parseFlags parses args. --help prints the usage on stdout and returns
// flag.ErrHelp; a bad flag's message and the usage go to stderr.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("stalewriter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "lease TTL (whole milliseconds, from 100ms to 1m)")
	fs.DurationVar(&o.pause, "pause", 0, "how long worker A is frozen, up to 10m (default: 2*TTL + 1s, well past the TTL)")
	fs.DurationVar(&o.writeDelay, "write-delay", 300*time.Millisecond, "time between A's lease check and its write, in which A is frozen (50ms to 10s)")
	fs.BoolVar(&o.unguarded, "unguarded", false, "write with plain SQL and plain PUT, without fencing, to show the failure")
	fs.BoolVar(&o.keep, "keep", false, "keep the schema, the lease's keys and the S3 object after the run, for inspection; servers\nthe demo started itself are stopped, and their data directories are kept (their paths are printed)")
	fs.StringVar(&o.leaseStore, "lease-store", demo.LeaseRedis, demo.LeaseStoreUsage)
	fs.BoolVar(&o.dynamodb, "dynamodb", false, "also write the report to a DynamoDB item through dynamoguard, in a table of the run's own\nat $"+demo.DynamoEndpointVar+" (with --lease-store dynamodb: leases and a fenced item in DynamoDB)")
	fs.StringVar(&o.rowStore, "row-store", rowPostgres, rowStoreUsage)
	fs.StringVar(&o.redisURL, "redis-url", "", "Redis URL (default: $FENCE_REDIS_URL, else redis://127.0.0.1:6379/0, else one it starts)")
	fs.StringVar(&o.pgURL, "postgres-url", "", "PostgreSQL URL (default: $FENCE_POSTGRES_URL, else postgres://postgres@127.0.0.1:5432/test, else one it starts)")
	fs.StringVar(&o.s3URL, "s3-endpoint", "", "S3 endpoint URL; needs FENCE_S3_ACCESS_KEY and FENCE_S3_SECRET_KEY (default: $FENCE_S3_ENDPOINT, else a versitygw it starts)")
	fs.StringVar(&o.jsonOut, "json", "", "also write a machine-readable summary of the run to this file")
	fs.BoolVar(&o.downstream, "downstream", false, downstreamUsage)
	if demo.WantsHelp(args) {
		fs.SetOutput(stdout)
		fs.Usage()
		return o, flag.ErrHelp
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var errs []error
	if o.ttl < minTTL || o.ttl > maxTTL || o.ttl%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("--ttl %v: must be a whole number of milliseconds, from %v to %v", o.ttl, minTTL, maxTTL))
	} else if o.pause == 0 {
		o.pause = 2*o.ttl + time.Second
	}
	if err := checkRowStore(o.rowStore); err != nil {
		errs = append(errs, err)
	}
	if err := demo.CheckLeaseStore(o.leaseStore); err != nil {
		errs = append(errs, err)
	} else if err := demo.CheckTTL(o.leaseStore, o.ttl); err != nil {
		errs = append(errs, err)
	}
	if o.pause < 0 || o.pause > maxPause {
		errs = append(errs, fmt.Errorf("--pause %v: must be positive and at most %v", o.pause, maxPause))
	}
	if o.writeDelay < minWriteDelay || o.writeDelay > maxWriteDelay {
		errs = append(errs, fmt.Errorf("--write-delay %v: must be from %v (or A may write before it is frozen) to %v", o.writeDelay, minWriteDelay, maxWriteDelay))
	}
	return o, errors.Join(errs...)
}

// summary is what --json writes.
type summary struct {
	OK           bool        `json:"ok"`
	Inconclusive bool        `json:"inconclusive"`
	Verdict      string      `json:"verdict"`
	Unguarded    bool        `json:"unguarded"`
	TTLMillis    int64       `json:"ttl_ms"`
	PauseMillis  int64       `json:"pause_ms"`
	TokenA       fence.Token `json:"token_a"`
	TokenB       fence.Token `json:"token_b"`
	Writes       []event     `json:"writes"`
	Final        finalState  `json:"final"`
	Services     []string    `json:"services"`
	// KeptDirs are the data directories of the servers the demo started,
	// left in place with --keep.
	KeptDirs []string      `json:"kept_dirs,omitempty"`
	Run      runInfo       `json:"run"`
	Events   []event       `json:"events"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// runInfo names what the run created (kept with --keep).
type runInfo struct {
	Schema      string `json:"schema"`
	Table       string `json:"table"`
	RowID       string `json:"row_id"`
	Bucket      string `json:"bucket"`
	ObjectKey   string `json:"object_key"`
	LeaseName   string `json:"lease_name"`
	LeaseStore  string `json:"lease_store"`
	RedisPrefix string `json:"redis_prefix"`
	// RowStore and RowDSN say where the row lives with --row-store
	// mariadb or sqlite (a database/sql DSN).
	RowStore string `json:"row_store,omitempty"`
	RowDSN   string `json:"row_dsn,omitempty"`
}

type finalState struct {
	RowWrittenBy   string      `json:"row_written_by"`
	RowToken       fence.Token `json:"row_token"`
	RowLockVersion int64       `json:"row_lock_version"`
	// RowStore is where the row lives: "" (postgres), mariadb or sqlite.
	RowStore        string      `json:"row_store,omitempty"`
	ObjectWrittenBy string      `json:"object_written_by"`
	ObjectToken     fence.Token `json:"object_token"`
	// Item is set with --dynamodb: ItemWrittenBy and ItemToken then say
	// who wrote the DynamoDB item last, with which token.
	Item          bool        `json:"item,omitempty"`
	ItemWrittenBy string      `json:"item_written_by,omitempty"`
	ItemToken     fence.Token `json:"item_token,omitempty"`
}

// run is the program: the timeline and the verdict go to stdout, errors to
// stderr. It returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "stalewriter: %v\n", err)
		return 2
	}
	ctx, out, errOut, stop := demo.Interrupts(context.Background(), stdout, stderr)
	defer stop()
	ledger, err := leftover.Begin(ctx, "stalewriter", func(f string, a ...any) { fmt.Fprintf(errOut, "stalewriter: "+f+"\n", a...) })
	if err != nil {
		fmt.Fprintf(errOut, "stalewriter: the run's ledger: %v\n", err)
		return 2
	}
	defer ledger.End() // last: after everything below is removed

	tl := demo.NewTimeline(out)
	mode := "guarded: fenced pgx transaction + blobguard"
	if o.unguarded {
		mode = "UNGUARDED: plain SQL UPDATE + plain S3 PUT"
	}
	fmt.Fprintf(out, "stalewriter: lease TTL %v, worker A frozen for %v, writes %s\n\n", o.ttl, o.pause, mode)

	svc, err := demo.ProvideServices(ctx, demo.ServicesConfig(o.leaseStore, services.Config{
		RedisURL: o.redisURL, PostgresURL: o.pgURL, S3Endpoint: o.s3URL, Keep: o.keep,
	}), out)
	if err != nil {
		fmt.Fprintf(errOut, "stalewriter: cannot run without its services:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return 2
	}
	defer svc.Close()

	sc, err := setUp(ctx, svc, o)
	if err != nil {
		fmt.Fprintf(errOut, "stalewriter: setting up: %v\n", err)
		return 2
	}
	if o.keep {
		defer sc.keep(out, svc)
	} else {
		defer sc.tearDown(errOut)
	}
	fmt.Fprintf(out, "Leases: %s.\n", sc.cfg.leaseStore().Describe())
	ds, err := startDownstream(o, out)
	if err != nil {
		fmt.Fprintf(errOut, "stalewriter: %v\n", err)
		return 2
	}
	defer ds.close()
	tl.Restart() // the timeline counts from the first worker, not from starting services
	fmt.Fprintf(out, "Row %s.%s id=%s and object s3://%s/%s start empty; lease %q.\n\nTimeline:\n",
		sc.cfg.Schema, sc.cfg.Table, sc.cfg.RowID, sc.cfg.S3.Bucket, sc.cfg.ObjectKey, sc.cfg.LeaseName)

	sum, err := sc.play(ctx, tl, o)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		fmt.Fprintf(errOut, "\nstalewriter: the run could not be completed: %v\n", err)
		return 2
	}
	sum.Services = svc.Used
	if o.keep {
		sum.KeptDirs = svc.Dirs
	}
	sum.Elapsed = tl.Elapsed()
	fmt.Fprintf(out, "\nFinal state:\n  row:    written by %s, token %d, lock_version %d\n  object: written by %s, token %d\n%s\n%s\n",
		orNone(sum.Final.RowWrittenBy), sum.Final.RowToken, sum.Final.RowLockVersion,
		orNone(sum.Final.ObjectWrittenBy), sum.Final.ObjectToken, itemLine(sum.Final), sum.Verdict)
	ds.finish(sum, out)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(sum, "", "  ")
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			fmt.Fprintf(errOut, "stalewriter: writing %s: %v\n", o.jsonOut, err)
			return 2
		}
	}
	switch {
	case sum.Inconclusive:
		return 2
	case !sum.OK:
		return 1
	}
	return 0
}

func orNone(s string) string {
	if s == "" {
		return "(nobody)"
	}
	return s
}

// scenario holds what one run created: the schema and the lease's keys
// (Stores), and the object in S3.
type scenario struct {
	cfg workerConfig
	*demo.Stores
	s3         *s3.Client
	objectDone func()         // strikes the object off the run's ledger
	dropRowDB  func() error   // removes the row's MariaDB database or SQLite file (--row-store)
	dynamo     *demo.RunTable // the run's DynamoDB table (--dynamodb)
}

func setUp(ctx context.Context, svc *services.Set, o options) (*scenario, error) {
	id := demo.RandomID()
	sc := &scenario{cfg: workerConfig{
		RedisURL: svc.RedisURL, PostgresURL: svc.PostgresURL, S3: svc.S3,
		Schema: "stalewriter_" + id, Table: "report", RowID: "2026-11",
		ObjectKey: "stalewriter/" + id + "/report.json", Resource: "report/2026-11",
		LeaseName: "stalewriter-" + id, LeaseStore: o.leaseStore, RedisPrefix: "fencekit:",
		Consensus: demo.StoreFor(o.leaseStore, svc),
		TTL:       o.ttl, WriteDelay: o.writeDelay, Unguarded: o.unguarded,
		RowStore: o.rowStore,
	}}
	var err error
	sc.Stores, err = demo.SetUpStores(ctx, demo.StoresConfig{
		PostgresURL: svc.PostgresURL, Schema: sc.cfg.Schema,
		CreateTables: sc.createTable,
		FencedTables: []string{sc.cfg.Table},
		LeaseStore:   sc.cfg.LeaseStore,
		RedisURL:     svc.RedisURL, RedisPrefix: sc.cfg.RedisPrefix, LeaseName: sc.cfg.LeaseName,
		Leases: sc.cfg.leaseStore(), TTL: sc.cfg.TTL,
		PostgresStarted: svc.PostgresStarted, RedisStarted: svc.RedisStarted,
	})
	if err != nil {
		return nil, err
	}
	if sc.cfg.rowStoreName() != rowPostgres {
		if sc.dropRowDB, err = sc.setUpRowDB(ctx); err != nil {
			return nil, errorsJoin(err, sc.Stores.TearDown())
		}
	}
	sc.s3 = services.NewS3Client(svc.S3)
	if o.dynamodb {
		if err := sc.setUpDynamo(ctx, id); err != nil {
			_ = sc.Stores.TearDown()
			return nil, err
		}
	}
	sc.objectDone = leftover.Track(leftover.Entry{Kind: leftover.KindS3Object, URL: svc.S3.Endpoint, Bucket: svc.S3.Bucket,
		Name: sc.cfg.ObjectKey, Access: svc.S3.AccessKey, Secret: svc.S3.SecretKey, Ephemeral: svc.S3Started})
	return sc, nil
}

// createTable creates the report table with its one row, not written yet.
func (sc *scenario) createTable(ctx context.Context, pool *pgxpool.Pool) error {
	table := pgx.Identifier{sc.cfg.Schema, sc.cfg.Table}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, written_by text NOT NULL, token bigint NOT NULL, note text NOT NULL)`); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, '', 0, 'not written yet')`, sc.cfg.RowID); err != nil {
		return fmt.Errorf("insert row: %w", err)
	}
	return nil
}

func (sc *scenario) tearDown(errOut io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := sc.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(sc.cfg.S3.Bucket), Key: aws.String(sc.cfg.ObjectKey)})
	if err == nil {
		sc.objectDone()
	}
	if sc.dropRowDB != nil {
		err = errors.Join(err, sc.dropRowDB())
	}
	if err := errors.Join(sc.Stores.TearDown(), err, sc.tearDownDynamo(ctx)); err != nil {
		fmt.Fprintf(errOut, "stalewriter: cleaning up: %v\n", err)
	}
}

// keep leaves what the run created in place (--keep) and says where it is.
func (sc *scenario) keep(out io.Writer, svc *services.Set) {
	sc.Stores.Keep()
	sc.objectDone()
	fmt.Fprintf(out, "\nKept (--keep):\n  schema %s in %s\n", sc.cfg.Schema, services.Redact(sc.cfg.PostgresURL))
	if sc.Redis != nil {
		fmt.Fprintf(out, "  lease keys %s and %s in %s\n", sc.Keys.Lease, sc.Keys.Token, sc.cfg.RedisURL)
	}
	if sc.cfg.RowDSN != "" {
		fmt.Fprintf(out, "  the row in %s: %s (remove it when done)\n", sc.cfg.RowStore, sc.cfg.RowDSN)
	}
	fmt.Fprintf(out, "  object s3://%s/%s at %s\n", sc.cfg.S3.Bucket, sc.cfg.ObjectKey, sc.cfg.S3.Endpoint)
	if d := sc.cfg.Dynamo; d != nil {
		sc.dynamo.Keep()
		fmt.Fprintf(out, "  item dynamodb://%s/%s at %s\n", d.Table, d.Key, d.Endpoint)
	}
	for _, d := range svc.Dirs {
		fmt.Fprintf(out, "  the data of a server this demo started (it stops now): %s; remove it when done\n", d)
	}
}

// proc is a running worker process.
type proc = demo.Child[event]

func (sc *scenario) startWorker(role string, acquireTimeout time.Duration) (*proc, error) {
	cfg := sc.cfg
	cfg.Role, cfg.AcquireTimeout = role, acquireTimeout
	return demo.StartChild[event]("worker", configVar, cfg)
}

// play runs the timeline and judges the outcome.
func (sc *scenario) play(ctx context.Context, tl *demo.Timeline, o options) (*summary, error) {
	sum := &summary{Unguarded: o.unguarded, TTLMillis: o.ttl.Milliseconds(), PauseMillis: o.pause.Milliseconds(),
		Run: runInfo{Schema: sc.cfg.Schema, Table: sc.cfg.Table, RowID: sc.cfg.RowID, Bucket: sc.cfg.S3.Bucket,
			ObjectKey: sc.cfg.ObjectKey, LeaseName: sc.cfg.LeaseName, LeaseStore: sc.cfg.LeaseStore, RedisPrefix: sc.cfg.RedisPrefix,
			RowStore: sc.cfg.RowStore, RowDSN: sc.cfg.RowDSN}}
	a, err := sc.startWorker("A", 30*time.Second)
	if err != nil {
		return nil, err
	}
	tl.Say(time.Now(), "orchestrator", "started worker A (pid %d)", a.Cmd.Process.Pid)
	var (
		b       *proc
		frozen  bool
		resume  <-chan time.Time
		aEvents = a.Events
		bEvents <-chan event
		aDone   = a.Done
		bDone   <-chan error
		running = 2
	)
	defer func() { // never leave a process behind, frozen or not
		for _, w := range []struct {
			p    *proc
			done <-chan error
		}{{a, aDone}, {b, bDone}} {
			if w.p == nil || w.done == nil {
				continue // never started, or already waited for
			}
			_ = w.p.Cmd.Process.Signal(syscall.SIGCONT)
			_ = w.p.Cmd.Process.Kill()
			for range w.p.Events { // the rest of its output, so that it can end
			}
			<-w.done
		}
	}()
	overall := time.After(o.pause + 6*o.ttl + 60*time.Second)
	for running > 0 {
		select {
		case e, ok := <-aEvents:
			if !ok {
				aEvents = nil
				continue
			}
			sum.Events = append(sum.Events, e)
			tl.Say(e.At, "worker A", "%s", e.Text)
			switch e.Kind {
			case evAcquired:
				sum.TokenA = e.Token
			case evFailed:
				return nil, fmt.Errorf("worker A: %s", e.Text)
			case evChecked:
				// Freeze A between its lease check and its write.
				if err := a.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					return nil, fmt.Errorf("SIGSTOP worker A: %w", err)
				}
				frozen = true
				sum.Events = append(sum.Events, event{At: time.Now(), Role: "orchestrator", Kind: evFroze})
				tl.Say(time.Now(), "orchestrator", "froze worker A with SIGSTOP for %v (TTL %v): its heartbeat stops with it", o.pause, o.ttl)
				resume = time.After(o.pause)
				if b, err = sc.startWorker("B", o.pause+4*o.ttl+30*time.Second); err != nil {
					return nil, err
				}
				bEvents, bDone = b.Events, b.Done
				tl.Say(time.Now(), "orchestrator", "started worker B (pid %d); it waits for the lease", b.Cmd.Process.Pid)
			}
		case e, ok := <-bEvents:
			if !ok {
				bEvents = nil
				continue
			}
			sum.Events = append(sum.Events, e)
			tl.Say(e.At, "worker B", "%s", e.Text)
			switch e.Kind {
			case evAcquired:
				sum.TokenB = e.Token
			case evFailed:
				return nil, fmt.Errorf("worker B: %s", e.Text)
			}
		case <-resume:
			resume = nil
			if err := a.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
				return nil, fmt.Errorf("SIGCONT worker A: %w", err)
			}
			frozen = false
			sum.Events = append(sum.Events, event{At: time.Now(), Role: "orchestrator", Kind: evResumed})
			tl.Say(time.Now(), "orchestrator", "resumed worker A with SIGCONT after %v; it goes on with its write", o.pause)
		case err := <-aDone:
			aDone = nil
			running--
			if err != nil {
				return nil, fmt.Errorf("worker A: %w", err)
			}
		case err := <-bDone:
			bDone = nil
			running--
			if err != nil {
				return nil, fmt.Errorf("worker B: %w", err)
			}
		case <-overall:
			return nil, fmt.Errorf("timed out (A frozen: %v)", frozen)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if b == nil && aDone == nil {
			return nil, errors.New("worker A exited before it was frozen")
		}
	}
	// Drain events that arrived with the exits.
	for _, ch := range []<-chan event{aEvents, bEvents} {
		if ch == nil {
			continue
		}
		for e := range ch {
			sum.Events = append(sum.Events, e)
			tl.Say(e.At, "worker "+e.Role, "%s", e.Text)
		}
	}
	if err := sc.readFinal(ctx, &sum.Final, o.unguarded); err != nil {
		return nil, fmt.Errorf("reading the final state: %w", err)
	}
	if err := sc.readFinalItem(ctx, &sum.Final); err != nil {
		return nil, fmt.Errorf("reading the final state: %w", err)
	}
	for _, e := range sum.Events {
		if e.Kind == evWrite {
			sum.Writes = append(sum.Writes, e)
		}
	}
	v := judge(sum.Events, sum.Final, o.unguarded)
	sum.OK, sum.Inconclusive, sum.Verdict = v.OK, v.Inconclusive, v.String()
	return sum, nil
}

func (sc *scenario) readFinal(ctx context.Context, f *finalState, unguarded bool) error {
	if sc.cfg.rowStoreName() != rowPostgres {
		if err := sc.readFinalDB(ctx, f); err != nil {
			return err
		}
	} else {
		table := pgx.Identifier{sc.cfg.Schema, sc.cfg.Table}.Sanitize()
		var tok int64
		if err := sc.Pool.QueryRow(ctx, `SELECT written_by, token, lock_version FROM `+table+` WHERE id = $1`, sc.cfg.RowID).
			Scan(&f.RowWrittenBy, &tok, &f.RowLockVersion); err != nil {
			return err
		}
		f.RowToken = fence.Token(tok)
	}
	var body []byte
	if unguarded {
		res, err := sc.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(sc.cfg.S3.Bucket), Key: aws.String(sc.cfg.ObjectKey)})
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if body, err = io.ReadAll(res.Body); err != nil {
			return err
		}
	} else {
		g, err := blobguard.New(sc.s3, sc.cfg.S3.Bucket)
		if err != nil {
			return err
		}
		obj, err := g.Get(ctx, sc.cfg.ObjectKey)
		if err != nil {
			return err
		}
		body = obj.Body
		if obj.Token() != fence.Token(0) {
			f.ObjectToken = obj.Token()
		}
	}
	var ob objectBody
	if err := json.Unmarshal(body, &ob); err != nil {
		return fmt.Errorf("object body %q: %w", body, err)
	}
	f.ObjectWrittenBy = ob.WrittenBy
	if f.ObjectToken == 0 {
		f.ObjectToken = ob.Token
	}
	return nil
}
