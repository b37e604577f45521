package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// fencekit verify: the toolkit's history checks, run against the user's
// own deployment. Worker processes contend for a lease name on the user's
// lease store and write a scratch resource through a guard on the user's
// store while the run injects faults; the history they report is checked
// (leasetest.CheckWindows, guardtest.Violations), written as JSON and
// shown as an HTML report.

const verifyUsage = `Usage:
  fencekit verify [flags]             run the history checks on your stores:
                                      worker processes contend for a lease
                                      (a name of the run's own) and write a
                                      scratch resource through a guard while
                                      faults are injected; then the history is
                                      checked, and written as a report (HTML)
                                      and as JSON
  fencekit verify --recheck FILE      check a recorded history (the JSON) again

The checks: no two holders valid at once (each holder's window runs from its
grant to its last reading of the lease that found it valid, and must end
before its own local deadline); tokens strictly growing from grant to grant;
guarded writes accepted only in token order, and stale answers naming a
token that was stored; the final state holding the last acknowledged write
(writes of unknown outcome may or may not have landed). The exit status is 0
when nothing was violated, 3 when something was (each violation is named),
1 when the run could not be made or checked, 2 for a usage error.

The lease store: the flags of fencekit lease (--store, --url, --prefix,
--schema, --redis-mode, --root, --table, --key-attribute, --timeout and the
FENCE_* variables). The lease name is fencekit-verify-RUN; nothing else of
the namespace is touched.

The guarded writes:
  --guard KIND        postgres (sqlguard), mysql (MySQL/MariaDB) or sqlite
                      (dbguard), dynamodb (dynamoguard) or s3 (blobguard)
                      (default: postgres with a PostgreSQL lease store,
                      dynamodb with DynamoDB)
  --guard-url ADDR    PostgreSQL URL ($FENCE_POSTGRES_URL), MySQL DSN
                      ($FENCE_MYSQL_URL), SQLite file, DynamoDB endpoint
                      ($FENCE_DYNAMODB_ENDPOINT) or S3 endpoint
                      ($FENCE_S3_ENDPOINT; keys $FENCE_S3_ACCESS_KEY and
                      $FENCE_S3_SECRET_KEY, else the AWS ones)
  --guard-schema S    the schema (PostgreSQL, SQLite) or database (MySQL) of
                      the scratch table (default: the connection's)
  --bucket B          S3: the bucket ($FENCE_S3_BUCKET)
The run creates a scratch table (SQL, DynamoDB) or key prefix (S3) named
fencekit_verify_EXPIRY_RANDOM, and removes it when it ends, also on Ctrl-C;
a run that was killed leaves it, and any later run removes it once EXPIRY
(a Unix second: the planned end plus 10 minutes) has passed.

The run:
  --duration D        how long the workers run (default 30s)
  --min-grants N      go on past --duration until the lease was granted N
                      times (default 0: stop at --duration); the run ends
                      at 4 × --duration in any case, and says so when it
                      fell short
  --ttl D             the lease's TTL (default 1s, or the store's shortest
                      TTL when it is longer: 2s on etcd)
  --workers N         worker processes (default 3, at least 2)
  --faults LIST       the faults to inject, comma-separated (default
                      stop,kill,drop,delay; "none" for none):
                        stop   SIGSTOP a worker, mostly the holder, for 0.5-2.5
                               TTL, then SIGCONT
                        kill   SIGKILL a worker (a new one takes its place)
                        drop   lose a worker's requests or replies to the lease
                               store or the guard's store for 0.3-1.5 TTL
                        delay  delay them by 0.1-0.6 TTL for 0.5-1.5 TTL
                        partition, restart: run the hooks below (one
                               at a time; with both, they take turns)
  --fault-interval D  the mean time between faults (default 1.5 × --ttl)
  --hook-partition CMD  run CMD (sh -c) to partition a store, and again to
                      heal it 1-2 TTL later ($FENCEKIT_VERIFY_EVENT is
                      partition, then heal)
  --hook-restart CMD  run CMD to restart a store; it returns when the store
                      is back ($FENCEKIT_VERIFY_EVENT=restart)
  --hook CMD          one command for every event ($FENCEKIT_VERIFY_EVENT:
                      partition, heal or restart); hooks also get
                      $FENCEKIT_VERIFY_RUN, $FENCEKIT_VERIFY_WORKER_PIDS and
                      $FENCEKIT_VERIFY_HOLDER_PID (empty when nobody holds)
  --hook-timeout D    give up on a hook after this long (default 1m)
  --seed N            the seed of the run's random choices (default: random;
                      the timings are the machine's, so a run is not replayed)
  --out DIR           where to write verify-RUN.html and verify-RUN.json
                      (default .); with --recheck, write the report there
`

// Exit status of a run that found a violation.
const exitViolation = 3

// maxListed is how many violations the summary lists.
const maxListed = 10

// verifyVars are the variables verify reads: the workers get their values
// from the run, not from their own environment.
var verifyVars = []string{redisURLVar, databaseURLVar, etcdEndpointsVar, zkServersVar, dynamoEndpoint, mysqlURLVar,
	"FENCE_S3_ENDPOINT", "FENCE_S3_ACCESS_KEY", "FENCE_S3_SECRET_KEY", "FENCE_S3_BUCKET",
	"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION"}

// Fault kinds of a run (--faults, faultRec.Kind).
const (
	faultStop      = "stop"
	faultKill      = "kill"
	faultDrop      = "drop"
	faultDelay     = "delay"
	faultPartition = "partition"
	faultRestart   = "restart"
)

// verifyFlags are the flags of fencekit verify (and of its workers, which
// parse the same arguments).
type verifyFlags struct {
	store                           storeFlags
	guard                           guardFlags
	duration, ttl, every, hookLimit time.Duration
	workers, minGrants              int
	faults, out, recheck            string
	hookPartition, hookRestart      string
	hook                            string
	seed                            uint64
}

func (v *verifyFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	v.store.register(fs, getenv)
	v.guard.register(fs, getenv)
	fs.DurationVar(&v.duration, "duration", 30*time.Second, "how long the workers run")
	fs.DurationVar(&v.ttl, "ttl", 0, "the lease's TTL (default 1s, or the store's shortest TTL if longer)")
	fs.IntVar(&v.workers, "workers", 3, "worker processes")
	fs.IntVar(&v.minGrants, "min-grants", 0, "go on past --duration until this many grants (at most 4 × --duration)")
	fs.StringVar(&v.faults, "faults", "stop,kill,drop,delay", "the faults to inject")
	fs.DurationVar(&v.every, "fault-interval", 0, "the mean time between faults (default 1.5 × --ttl)")
	fs.StringVar(&v.hookPartition, "hook-partition", "", "a command that partitions a store (and heals it)")
	fs.StringVar(&v.hookRestart, "hook-restart", "", "a command that restarts a store")
	fs.StringVar(&v.hook, "hook", "", "a command for every event")
	fs.DurationVar(&v.hookLimit, "hook-timeout", time.Minute, "give up on a hook after this long")
	fs.Uint64Var(&v.seed, "seed", 0, "the seed of the run's random choices")
	fs.StringVar(&v.out, "out", ".", "where to write the report and the history")
	fs.StringVar(&v.recheck, "recheck", "", "check this recorded history again")
}

// longest is how long the workers can run: --duration, or four times it
// when --min-grants may make the run go on past it.
func (v *verifyFlags) longest() time.Duration {
	if v.minGrants > 0 {
		return 4 * v.duration
	}
	return v.duration
}

// faultKinds returns the kinds of fault the run injects.
func (v *verifyFlags) faultKinds() ([]string, error) {
	var kinds []string
	if v.faults != "none" {
		for _, k := range splitList(v.faults) {
			switch k {
			case faultStop, faultKill, faultDrop, faultDelay:
			case faultPartition:
				if v.hookPartition == "" && v.hook == "" {
					return nil, errors.New("--faults partition needs --hook-partition or --hook")
				}
			case faultRestart:
				if v.hookRestart == "" && v.hook == "" {
					return nil, errors.New("--faults restart needs --hook-restart or --hook")
				}
			default:
				return nil, fmt.Errorf("unknown fault %q in --faults (stop, kill, drop, delay, partition, restart, or none)", k)
			}
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
	}
	if (v.hookPartition != "" || v.hook != "") && !slices.Contains(kinds, faultPartition) {
		kinds = append(kinds, faultPartition)
	}
	if (v.hookRestart != "" || v.hook != "") && !slices.Contains(kinds, faultRestart) {
		kinds = append(kinds, faultRestart)
	}
	if !signalsAvailable {
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == faultStop || k == faultKill })
	}
	return kinds, nil
}

func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	for _, a := range args {
		if isHelp(a) {
			fmt.Fprint(stdout, verifyUsage)
			return exitOK
		}
	}
	fs := flag.NewFlagSet("fencekit verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, verifyUsage) }
	var v verifyFlags
	v.register(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	outSet := false
	fs.Visit(func(f *flag.Flag) {
		v.store.prefixSet = v.store.prefixSet || f.Name == "prefix"
		outSet = outSet || f.Name == "out"
	})
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fencekit verify: %s\n", fmt.Sprintf(format, a...))
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	if v.recheck != "" {
		out := ""
		if outSet {
			out = v.out
		}
		return recheck(v.recheck, out, stdout, stderr)
	}
	kinds, err := v.faultKinds()
	switch {
	case err != nil:
		return usageErr("%v", err)
	case v.duration <= 0:
		return usageErr("--duration must be positive")
	case v.minGrants < 0:
		return usageErr("--min-grants must not be negative")
	case v.ttl < 0:
		return usageErr("--ttl must be positive")
	case v.workers < 2:
		return usageErr("--workers must be at least 2: a lease nobody contends for proves nothing")
	case v.every < 0:
		return usageErr("--fault-interval must not be negative")
	case v.store.timeout <= 0:
		return usageErr("--timeout must be positive")
	case v.hookLimit <= 0:
		return usageErr("--hook-timeout must be positive")
	}
	kind, err := v.store.kind()
	if err != nil {
		return usageErr("%v", err)
	}
	if err := v.guard.resolve(kind); err != nil {
		return usageErr("%v", err)
	}
	if v.seed == 0 {
		v.seed = rand.Uint64()
	}
	r := &verifyRun{v: &v, args: args, stdout: stdout, stderr: stderr, getenv: getenv, faultKinds: kinds, storeKind: kind, partitioned: -1}
	return r.run(ctx)
}

// verifyRun is one run of fencekit verify.
type verifyRun struct {
	v          *verifyFlags
	args       []string
	stdout     io.Writer
	stderr     io.Writer
	getenv     func(string) string
	faultKinds []string
	storeKind  string

	id      string
	epoch   time.Time
	h       verifyHistory
	scratch scratch
	guard   guardStore
	rng     *rand.Rand
	spawn   *spawner

	procs    []*workerProc
	events   chan procEvent
	posted   chan func()
	loopDone chan struct{}
	timers   []*time.Timer
	hookBusy bool
	// hookTurn counts the hook faults run: partitions and restarts take
	// turns (see inject).
	hookTurn int
	hooks    sync.WaitGroup
	// partitioned is the index in h.Faults of the partition in force
	// (healed at the end at the latest), or -1.
	partitioned int
	// stopAtCheck, when not zero, is a SIGSTOP's length: the next worker
	// that reads its lease valid is stopped then.
	stopAtCheck time.Duration
	nextID      int
	stopping    bool
	runErr      error
	lastNote    time.Time
}

// workerProc is one worker process, as the run sees it.
type workerProc struct {
	id      string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  *limitedBuffer
	pid     int
	ready   bool
	holding bool
	stopped bool
	busy    bool
	exited  bool
	killed  int64 // when it was sent SIGKILL; -1 if never
	grant   int   // the index of its open grant in h.Grants, -1
	pending map[int]int
	// stopFault is the index in h.Faults of the SIGSTOP in force, or -1.
	stopFault int
}

// procEvent is a line a worker wrote, or its exit.
type procEvent struct {
	p    *workerProc
	ev   workerEvent
	exit bool
	err  error
}

func (r *verifyRun) now() int64 { return time.Now().UnixNano() - r.epoch.UnixNano() }

func (r *verifyRun) logf(format string, a ...any) {
	fmt.Fprintf(r.stderr, "fencekit verify: "+format+"\n", a...)
}

func (r *verifyRun) run(ctx context.Context) int {
	began := time.Now()
	r.id = began.UTC().Format("20060102-150405") + "-" + randHex(2)
	r.rng = rand.New(rand.NewPCG(r.v.seed, 0xfa17))
	lname := "fencekit-verify-" + r.id
	plant := r.getenv(plantVar)
	if plant != "" {
		r.logf("TEST EQUIPMENT: the workers run with a planted bug (%s=%s): this run checks the checks, not your deployment", plantVar, plant)
	}

	// The lease store: reachable, set up, and able to keep the TTL.
	log := slog.New(slog.NewTextHandler(r.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	octx, cancel := context.WithTimeout(ctx, r.v.store.timeout)
	defer cancel()
	b, _, closeStore, err := r.v.store.openStore(octx, log)
	if err != nil {
		r.logf("%v", err)
		return exitFail
	}
	defer closeStore()
	if r.v.ttl == 0 {
		r.v.ttl = max(time.Second, b.Limits().MinTTL)
	}
	if r.v.every == 0 {
		r.v.every = r.v.ttl * 3 / 2
	}
	m, err := lease.NewManager(b, r.v.ttl, lease.WithLogger(log))
	if err != nil {
		r.logf("%s cannot keep --ttl %v: %v", r.storeKind, r.v.ttl, err)
		return exitFail
	}
	if err := m.Check(octx); err != nil {
		r.logf("the lease store: %v", err)
		return exitFail
	}

	// The guard's store: earlier runs' leftovers swept, a scratch resource
	// of this run's own, removed however the run ends.
	if r.guard, err = r.v.guard.open(octx, nil); err != nil {
		r.logf("the guard's store: %v", err)
		return exitFail
	}
	defer r.guard.close()
	swept, err := r.guard.sweep(octx, began)
	for _, s := range swept {
		r.logf("removed %s, left by an earlier run that was killed", s)
	}
	if err != nil {
		r.logf("the guard's store: removing earlier runs' scratch resources: %v", err)
		return exitFail
	}
	expires := began.Add(r.v.longest() + scratchGrace)
	r.scratch = newScratch(expires, randHex(4))
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Minute) // a DynamoDB table takes a while
	err = r.guard.create(cctx, &r.scratch)
	ccancel()
	if err != nil {
		r.logf("the guard's store: creating %s: %v", r.scratch.Name, err)
		return exitFail
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), r.v.store.timeout)
		defer cancel()
		if err := r.guard.remove(rctx, r.scratch); err != nil {
			r.logf("could not remove %s (a later run removes it after %s): %v", r.guard.where(r.scratch), expires.Format(time.RFC3339), err)
		}
	}()
	cancel()

	r.h = verifyHistory{Format: historyFormat, Run: runInfo{
		ID: r.id, Fencekit: versionLine(), RequestedNS: int64(r.v.duration),
		Store: r.storeKind, StoreDesc: r.storeDesc(), Guard: r.v.guard.kind, GuardDesc: r.guard.desc(),
		Lease: lname, Resource: r.guard.where(r.scratch), Scratch: r.scratch, TTLNS: int64(r.v.ttl), Workers: r.v.workers,
		Seed: r.v.seed, Faults: r.faultKinds, Plant: plant,
	}}
	r.logf("run %s: %d workers contend for lease %q on %s (TTL %v) and write %s through %s, for %v; faults: %s (seed %d)",
		r.id, r.v.workers, lname, r.h.Run.StoreDesc, r.v.ttl, r.h.Run.Resource, r.h.Run.GuardDesc, r.v.duration, faultList(r.faultKinds), r.v.seed)

	code := r.contend(ctx)
	if code != exitOK {
		return code
	}
	return r.finish(ctx)
}

// storeDesc names the lease store for people.
func (r *verifyRun) storeDesc() string {
	d := r.storeKind
	if r.storeKind == storeRedis && r.v.store.redisMode != "standalone" && r.v.store.redisMode != "" {
		d += " (" + r.v.store.redisMode + ")"
	}
	return d
}

func faultList(kinds []string) string {
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, ", ")
}

// contend starts the workers, injects faults until the run's time is up
// (or ctx ends: Ctrl-C), then stops them.
func (r *verifyRun) contend(ctx context.Context) int {
	r.events = make(chan procEvent, 256)
	r.posted = make(chan func(), 16)
	r.loopDone = make(chan struct{})
	r.spawn = newSpawner()
	defer r.spawn.close()
	// The run's clock starts with the workers.
	r.epoch = time.Now()
	r.h.Run.Started = r.epoch.UTC()
	defer func() {
		close(r.loopDone)
		for _, t := range r.timers {
			t.Stop()
		}
		r.hooks.Wait()
	}()

	for range r.v.workers {
		if err := r.startWorker(); err != nil {
			r.logf("starting a worker: %v", err)
			r.killAll()
			r.drain(10 * time.Second)
			return exitFail
		}
	}
	// Every worker set up (or one failed) before the clock starts.
	setup := time.NewTimer(r.v.store.timeout + 10*time.Second)
	defer setup.Stop()
	for r.ready() < r.v.workers {
		select {
		case e := <-r.events:
			r.handle(e)
			if r.runErr != nil {
				r.logf("%v", r.runErr)
				r.killAll()
				r.drain(10 * time.Second)
				return exitFail
			}
		case <-setup.C:
			r.logf("the workers did not set up within %v", r.v.store.timeout+10*time.Second)
			r.killAll()
			r.drain(10 * time.Second)
			return exitFail
		case <-ctx.Done():
			r.killAll()
			r.drain(10 * time.Second)
			r.logf("interrupted while the workers set up")
			return exitFail
		}
	}

	start := time.Now()
	end := time.NewTimer(r.v.duration)
	defer end.Stop()
	fault := time.NewTimer(r.faultDelay())
	defer fault.Stop()
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	interrupted := false
	extended := false // past --duration, waiting for --min-grants
	atLimit := false  // ended at 4 × --duration with fewer grants than --min-grants so far
loop:
	for {
		select {
		case e := <-r.events:
			r.handle(e)
			if r.runErr != nil || extended && len(r.h.Grants) >= r.v.minGrants {
				break loop
			}
		case f := <-r.posted:
			f()
			if r.runErr != nil {
				break loop
			}
		case <-fault.C:
			if len(r.faultKinds) > 0 {
				r.inject()
			}
			fault.Reset(r.faultDelay())
		case <-progress.C:
			r.progress(time.Since(start), false)
		case <-end.C:
			if n := len(r.h.Grants); n < r.v.minGrants && !extended {
				extended = true
				end.Reset(r.v.longest() - r.v.duration)
				r.logf("%v passed with %d grants; going on until %d (--min-grants), at most until %v in all", r.v.duration, n, r.v.minGrants, r.v.longest())
				continue
			}
			atLimit = extended
			break loop
		case <-ctx.Done():
			interrupted = true
			break loop
		}
	}
	r.h.Run.DurationNS = int64(time.Since(start))
	r.h.Run.Interrupted = interrupted
	if interrupted {
		r.logf("interrupted: stopping the workers, checking what they did so far, removing the scratch resource")
	}
	r.stopAll()
	// Counted once the workers stopped: a grant reported while they
	// stopped counts too.
	if n := len(r.h.Grants); atLimit && n < r.v.minGrants {
		r.logf("ended at %v with %d grants, fewer than --min-grants %d", r.v.longest(), n, r.v.minGrants)
	}
	r.progress(time.Since(start), true)
	if r.runErr != nil {
		r.logf("%v", r.runErr)
		return exitFail
	}
	return exitOK
}

// faultDelay is the time until the next fault: 0.5-1.5 × the mean.
func (r *verifyRun) faultDelay() time.Duration {
	return time.Duration((0.5 + r.rng.Float64()) * float64(r.v.every))
}

func (r *verifyRun) ready() int {
	n := 0
	for _, p := range r.procs {
		if p.ready && !p.exited {
			n++
		}
	}
	return n
}

// startWorker starts one more worker process.
func (r *verifyRun) startWorker() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r.nextID++
	p := &workerProc{id: fmt.Sprintf("w%d", r.nextID), killed: -1, grant: -1, stopFault: -1, pending: map[int]int{}, stderr: &limitedBuffer{max: 8 << 10}}
	env := map[string]string{}
	for _, k := range verifyVars {
		if v := r.getenv(k); v != "" {
			env[k] = v
		}
	}
	spec := workerSpec{Worker: p.id, Args: r.args, Env: env, Lease: r.h.Run.Lease, Scratch: r.scratch, TTL: r.v.ttl,
		Seed: r.v.seed + uint64(r.nextID), Epoch: r.epoch.UnixNano()}
	line, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(exe, workerCommand)
	p.cmd.Env = os.Environ()
	if plant := r.getenv(plantVar); plant != "" {
		p.cmd.Env = append(p.cmd.Env, plantVar+"="+plant)
	}
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = workerProcAttr()
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := r.spawn.start(p.cmd); err != nil {
		return err
	}
	p.pid = p.cmd.Process.Pid
	r.procs = append(r.procs, p)
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		return err
	}
	go func() {
		s := bufio.NewScanner(stdout)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			var e workerEvent
			if json.Unmarshal(s.Bytes(), &e) == nil {
				select {
				case r.events <- procEvent{p: p, ev: e}:
				case <-r.loopDone:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		err := p.cmd.Wait()
		select {
		case r.events <- procEvent{p: p, exit: true, err: err}:
		case <-r.loopDone:
		}
	}()
	return nil
}

// send writes a command to a worker; a worker that is gone is ignored.
func (r *verifyRun) send(p *workerProc, c workerCmd) {
	if p.exited {
		return
	}
	b, _ := json.Marshal(c)
	_, _ = p.stdin.Write(append(b, '\n'))
}

// handle takes one event of a worker into the history.
func (r *verifyRun) handle(e procEvent) {
	p := e.p
	if e.exit {
		p.exited = true
		r.closeGrant(p, r.now(), endKilled, "")
		if p.killed < 0 && !r.stopping && r.runErr == nil {
			r.runErr = fmt.Errorf("worker %s exited (%v): %s", p.id, e.err, strings.TrimSpace(p.stderr.String()))
		}
		return
	}
	ev := e.ev
	switch ev.Ev {
	case evHello:
		p.ready = true
	case evFailed:
		r.runErr = fmt.Errorf("worker %s could not set up: %s", p.id, ev.Err)
	case evAcquired:
		r.closeGrant(p, ev.At, endKilled, "")
		p.holding = true
		p.grant = len(r.h.Grants)
		r.h.Grants = append(r.h.Grants, grantRec{Worker: p.id, Token: ev.Token, Acquired: ev.At, LastValid: -1, Ended: -1})
	case evChecked:
		if p.grant >= 0 {
			g := &r.h.Grants[p.grant]
			if ev.Checked > g.LastValid {
				g.LastValid, g.Deadline = ev.Checked, ev.Deadline
			}
		}
		// Until the write reports its call, it counts as called when the
		// lease was read: a worker killed before it returns may have sent
		// it at any moment since.
		p.pending[ev.Seq] = len(r.h.Writes)
		r.h.Writes = append(r.h.Writes, writeRec{Worker: p.id, Token: ev.Token, Value: ev.Value, Checked: ev.Checked, Call: ev.Checked, Return: -1})
		if r.stopAtCheck > 0 && p.holding {
			// The SIGSTOP lands between the reading and the write: the
			// write goes out late, after the lease was lost.
			r.stopWorker(p, r.stopAtCheck)
			r.stopAtCheck = 0
		}
	case evWrite:
		if i, ok := p.pending[ev.Seq]; ok {
			delete(p.pending, ev.Seq)
			w := &r.h.Writes[i]
			w.Call, w.Return, w.Outcome, w.Current, w.Err = ev.Call, ev.At, ev.Outcome, ev.Current, ev.Err
		}
	case evEnded:
		if p.grant >= 0 {
			g := &r.h.Grants[p.grant]
			if ev.LastValid > g.LastValid {
				g.LastValid, g.Deadline = ev.LastValid, ev.Deadline
			}
			g.Ended, g.How, g.Err = ev.At, ev.How, ev.Err
			p.grant = -1
		}
		p.holding = false
	case evFault:
		r.h.Faults = append(r.h.Faults, faultRec{Kind: ev.Kind, Worker: p.id, Target: ev.Target, Start: ev.At, End: ev.End})
	case evError:
		if time.Since(r.lastNote) > 5*time.Second {
			r.lastNote = time.Now()
			r.logf("worker %s: acquire: %s", p.id, ev.Err)
		}
	}
}

// closeGrant ends p's open grant (the worker was killed, or a new grant
// began without an end reported), and gives its writes in flight an
// unknown outcome.
func (r *verifyRun) closeGrant(p *workerProc, at int64, how, errText string) {
	if p.killed >= 0 {
		at = p.killed
	}
	if p.grant >= 0 {
		g := &r.h.Grants[p.grant]
		g.Ended, g.How, g.Err = at, how, errText
		p.grant = -1
	}
	for seq, i := range p.pending {
		w := &r.h.Writes[i]
		w.Return, w.Outcome, w.Err = at, fence.Unknown, "the worker was killed while the write was in flight"
		delete(p.pending, seq)
	}
	p.holding = false
}

// inject injects one fault, aimed at a worker that holds the lease four
// times in five. A draw of a hook's fault (partition or restart) while a
// hook is still busy is skipped; when both are in the run, the hook faults
// that do run take turns, so that skipped draws cannot leave one of them
// out of a run.
func (r *verifyRun) inject() {
	kind := r.faultKinds[r.rng.IntN(len(r.faultKinds))]
	if kind == faultPartition || kind == faultRestart {
		if !r.hookBusy {
			r.runHookFault(r.nextHookFault())
		}
		return
	}
	var holding, others []*workerProc
	for _, p := range r.procs {
		if p.exited || !p.ready || p.busy || p.killed >= 0 {
			continue
		}
		if p.holding {
			holding = append(holding, p)
		} else {
			others = append(others, p)
		}
	}
	pool := holding
	if len(pool) == 0 || (len(others) > 0 && r.rng.IntN(5) == 0) {
		pool = others
	}
	if len(pool) == 0 {
		return
	}
	p := pool[r.rng.IntN(len(pool))]
	ttl := float64(r.v.ttl)
	between := func(lo, hi float64) time.Duration { return time.Duration((lo + r.rng.Float64()*(hi-lo)) * ttl) }
	switch kind {
	case faultStop:
		if r.rng.IntN(2) == 0 {
			// Half the pauses fall at the next holder's reading of its
			// lease, before the write it allows, and outlast its lease:
			// the write then goes out after another holder took over.
			r.stopAtCheck = between(1.5, 3)
			return
		}
		r.stopWorker(p, between(0.5, 2.5))
	case faultKill:
		now := r.now()
		if err := killProcess(p.cmd.Process); err != nil {
			return
		}
		p.killed, p.busy = now, true
		r.h.Faults = append(r.h.Faults, faultRec{Kind: "sigkill", Worker: p.id, Start: now, End: now})
		if err := r.startWorker(); err != nil {
			r.runErr = fmt.Errorf("starting a worker in place of the killed %s: %v", p.id, err)
		}
	case faultDrop, faultDelay:
		target := targetLease
		if r.guard.networked() && r.rng.IntN(2) == 0 {
			target = targetGuard
		}
		c := workerCmd{Cmd: "fault", Target: target}
		if kind == faultDrop {
			c.Kind, c.For = faultDropRequests, between(0.3, 1.5)
			if r.rng.IntN(2) == 0 {
				c.Kind = faultDropReplies
			}
		} else {
			c.Kind, c.For, c.Latency = faultDelayRequests, between(0.5, 1.5), between(0.1, 0.6)
			if r.rng.IntN(2) == 0 {
				c.Kind = faultDelayReplies
			}
		}
		p.busy = true
		r.send(p, c)
		r.after(c.For, func() { p.busy = false })
	}
}

// nextHookFault is the hook fault whose turn it is: the run's hook fault
// kinds in the order of --faults, one after the other.
func (r *verifyRun) nextHookFault() string {
	var kinds []string
	for _, k := range r.faultKinds {
		if k == faultPartition || k == faultRestart {
			kinds = append(kinds, k)
		}
	}
	k := kinds[r.hookTurn%len(kinds)]
	r.hookTurn++
	return k
}

// stopWorker sends SIGSTOP to p, and SIGCONT d later.
func (r *verifyRun) stopWorker(p *workerProc, d time.Duration) {
	if p.exited || p.stopped || p.killed >= 0 || r.stopping {
		return
	}
	if err := stopProcess(p.cmd.Process); err != nil {
		return
	}
	p.stopped, p.busy, p.stopFault = true, true, len(r.h.Faults)
	r.h.Faults = append(r.h.Faults, faultRec{Kind: "sigstop", Worker: p.id, Start: r.now(), End: -1, Detail: fmt.Sprintf("for %v", d.Round(time.Millisecond))})
	r.after(d, func() { r.resume(p) })
}

// resume sends SIGCONT to a worker r.inject stopped.
func (r *verifyRun) resume(p *workerProc) {
	if !p.stopped {
		return
	}
	_ = continueProcess(p.cmd.Process)
	p.stopped, p.busy = false, false
	r.h.Faults[p.stopFault].End = r.now()
	p.stopFault = -1
}

// after runs f in the run's loop after d.
func (r *verifyRun) after(d time.Duration, f func()) {
	r.timers = append(r.timers, time.AfterFunc(d, func() {
		select {
		case r.posted <- f:
		case <-r.loopDone:
		}
	}))
}

// runHookFault runs the user's hook for a partition (and, 1-2 TTL later,
// its heal) or a restart.
func (r *verifyRun) runHookFault(kind string) {
	r.hookBusy = true
	fi := len(r.h.Faults)
	r.h.Faults = append(r.h.Faults, faultRec{Kind: kind, Start: r.now(), End: -1})
	r.hookAsync(kind, func(detail string, err error) {
		r.h.Faults[fi].Detail = detail
		if err != nil {
			r.h.Faults[fi].End = r.now()
			r.hookBusy = false
			r.runErr = err
			return
		}
		if kind == faultRestart {
			r.h.Faults[fi].End = r.now()
			r.hookBusy = false
			return
		}
		r.partitioned = fi
		d := time.Duration((1 + r.rng.Float64()) * float64(r.v.ttl))
		r.after(d, r.heal)
	})
}

// heal runs the hook's heal event for the partition in force.
func (r *verifyRun) heal() {
	fi := r.partitioned
	if fi < 0 {
		return
	}
	r.partitioned = -1
	r.hookAsync("heal", func(detail string, err error) {
		r.h.Faults[fi].End = r.now()
		if detail != "" {
			r.h.Faults[fi].Detail += "; heal: " + detail
		}
		r.hookBusy = false
		if err != nil {
			r.runErr = err
		}
	})
}

// hookAsync runs the hook for event in the background and done, with its
// output, in the run's loop.
func (r *verifyRun) hookAsync(event string, done func(detail string, err error)) {
	cmdline := r.v.hook
	switch {
	case (event == faultPartition || event == "heal") && r.v.hookPartition != "":
		cmdline = r.v.hookPartition
	case event == faultRestart && r.v.hookRestart != "":
		cmdline = r.v.hookRestart
	}
	var pids []string
	holder := ""
	for _, p := range r.procs {
		if !p.exited {
			pids = append(pids, fmt.Sprint(p.pid))
			if p.holding {
				holder = fmt.Sprint(p.pid)
			}
		}
	}
	env := append(os.Environ(), "FENCEKIT_VERIFY_EVENT="+event, "FENCEKIT_VERIFY_RUN="+r.id,
		"FENCEKIT_VERIFY_WORKER_PIDS="+strings.Join(pids, " "), "FENCEKIT_VERIFY_HOLDER_PID="+holder)
	r.hooks.Add(1)
	go func() {
		defer r.hooks.Done()
		ctx, cancel := context.WithTimeout(context.Background(), r.v.hookLimit)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-c", cmdline)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		detail := strings.TrimSpace(string(out))
		if len(detail) > 2000 {
			detail = detail[:2000] + "..."
		}
		if err != nil {
			err = fmt.Errorf("the %s hook (%s) failed: %v: %s", event, cmdline, err, detail)
		}
		select {
		case r.posted <- func() { done(detail, err) }:
		case <-r.loopDone:
		}
	}()
}

// stopAll ends the run: stopped workers continued, a partition healed,
// every worker asked to stop (it releases its lease and exits), those that
// do not in time killed.
func (r *verifyRun) stopAll() {
	r.stopping = true
	for _, p := range r.procs {
		r.resume(p)
	}
	// A partition in force is healed, and the hooks that run finish,
	// before the workers release their leases.
	r.heal()
	wait := time.NewTimer(r.v.hookLimit)
	for r.hookBusy {
		select {
		case f := <-r.posted:
			f()
			r.heal()
		case <-wait.C:
			r.hookBusy = false
		}
	}
	wait.Stop()
	for _, p := range r.procs {
		r.send(p, workerCmd{Cmd: "stop"})
	}
	if !r.drainWith(2*r.v.ttl+r.v.store.timeout, true) {
		r.killAll()
		r.drain(10 * time.Second)
	}
}

// killAll kills every worker still running.
func (r *verifyRun) killAll() {
	for _, p := range r.procs {
		if !p.exited {
			if p.killed < 0 {
				p.killed = r.now()
			}
			_ = continueProcess(p.cmd.Process)
			_ = p.cmd.Process.Kill()
		}
	}
}

// drain handles events until every worker has exited, or d passed; it
// reports whether they all exited.
func (r *verifyRun) drain(d time.Duration) bool { return r.drainWith(d, false) }

func (r *verifyRun) drainWith(d time.Duration, runPosted bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for slices.ContainsFunc(r.procs, func(p *workerProc) bool { return !p.exited }) {
		select {
		case e := <-r.events:
			r.handle(e)
		case f := <-r.posted:
			if runPosted {
				f()
			}
		case <-t.C:
			return false
		}
	}
	return true
}

// progress shows where the run is, on one line (rewritten in place on a
// terminal).
func (r *verifyRun) progress(elapsed time.Duration, last bool) {
	c := countHistory(&r.h)
	faults := 0
	for _, n := range c.Faults {
		faults += n
	}
	line := fmt.Sprintf("fencekit verify: %3.0fs/%v  grants %d  writes %d (accepted %d, stale %d, unknown %d, failed %d)  faults %d",
		elapsed.Seconds(), r.v.duration, c.Grants, c.Writes, c.Accepted, c.Stale, c.Unknown, c.Failed, faults)
	switch {
	case isTerminal(r.stderr) && !last:
		fmt.Fprintf(r.stderr, "\r%s\x1b[K", line)
	case isTerminal(r.stderr):
		fmt.Fprintf(r.stderr, "\r%s\x1b[K\n", line)
	case last || int(elapsed.Seconds())%5 == 0:
		fmt.Fprintln(r.stderr, line)
	}
}

// finish reads the final state, checks the history, writes the files and
// says what was found.
func (r *verifyRun) finish(ctx context.Context) int {
	var (
		tok fence.Token
		val string
		err error
	)
	for try := range 3 {
		rctx, cancel := context.WithTimeout(context.Background(), r.v.store.timeout)
		tok, val, err = r.guard.read(rctx, r.scratch)
		cancel()
		if err == nil || try == 2 {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		r.h.FinalError = err.Error()
	}
	r.h.Final = stateRec{Token: tok, Value: val}
	r.h.Run.ClockDriftNS = int64(time.Now().Round(0).Sub(r.epoch.Round(0)) - time.Since(r.epoch))
	sortHistory(&r.h)
	return report(&r.h, r.v.out, r.stdout, r.stderr, "")
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// randHex returns n random bytes in hexadecimal.
func randHex(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.IntN(256))
	}
	return fmt.Sprintf("%x", b)
}
