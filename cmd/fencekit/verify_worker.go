package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// A verify worker: a process fencekit verify starts (the fencekit binary
// again, with the hidden verify-worker command), which contends for the
// run's lease name and, while it holds the lease, writes the scratch
// resource through the guard. It reads its work from its stdin (one
// workerSpec line, then commands) and writes what it does and sees to its
// stdout (one workerEvent a line).

// workerCommand is the hidden command a verify worker runs.
const workerCommand = "verify-worker"

// plantVar names the environment variable that plants a bug in the
// workers. It is test equipment, for the tests that show that verify
// catches each kind of bug; only the worker reads it, and a run with a
// bug planted says so on its first line and in its report.
const plantVar = "FENCEKIT_VERIFY_PLANT"

// The bugs a test can plant (plantVar's values).
const (
	// plantNoCompare: a guard whose comparison is removed. Each write
	// presents the stored token when it is newer than the worker's own,
	// so the store accepts it.
	plantNoCompare = "guard-no-compare"
	// plantGrantHeld: a backend that grants a held name. An Acquire
	// refused because another owner holds the name revokes that grant and
	// takes the name, while its holder still counts itself valid.
	plantGrantHeld = "grant-held"
	// plantPastDeadline: a holder that writes past its deadline. It takes
	// its lease as valid for all the writes it planned, whatever
	// Lease.Err says.
	plantPastDeadline = "write-past-deadline"
)

// workerSpec is a worker's work: the first line of its stdin.
type workerSpec struct {
	Worker string `json:"worker"`
	// Args are the verify command's flags and Env the variables it read:
	// the worker configures the stores from them as the command did.
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	Lease   string            `json:"lease"`
	Scratch scratch           `json:"scratch"`
	TTL     time.Duration     `json:"ttl"`
	Seed    uint64            `json:"seed"`
	// Epoch is the run's start, in Unix nanoseconds: every time a worker
	// reports is nanoseconds since then, on the wall clock.
	Epoch int64 `json:"epoch"`
}

// workStep is about how long a worker's step takes on a fast store: a
// reading of the lease, 2-10 ms of thought, a write, 5-15 ms of rest.
const workStep = 17 * time.Millisecond

// workerCmd is a command the run sends a worker after its spec.
type workerCmd struct {
	Cmd     string        `json:"cmd"` // "fault" or "stop"
	Kind    string        `json:"kind,omitempty"`
	Target  string        `json:"target,omitempty"`
	For     time.Duration `json:"for,omitempty"`
	Latency time.Duration `json:"latency,omitempty"`
}

// Worker events (workerEvent.Ev).
const (
	evHello    = "hello"    // Pid, Plant: set up, about to contend
	evAcquired = "acquired" // Token, At: Acquire returned
	evChecked  = "checked"  // Seq, Token, Value, Checked, Deadline: the lease read valid; write Seq follows
	evWrite    = "write"    // Seq, Call, At (its return), Outcome, Current, Err
	evEnded    = "ended"    // Token, LastValid, Deadline, How, Err, At
	evFault    = "fault"    // Kind, Target, At, End: a fault on its connections
	evError    = "error"    // Err: an Acquire that failed otherwise than by contention
	evFailed   = "failed"   // Err: the worker could not set up; it exits
	evBye      = "bye"      // it stopped as asked
)

// workerEvent is one line of a worker's stdout.
type workerEvent struct {
	Ev        string        `json:"ev"`
	At        int64         `json:"at"`
	Pid       int           `json:"pid,omitempty"`
	Plant     string        `json:"plant,omitempty"`
	Token     fence.Token   `json:"token,omitempty"`
	Seq       int           `json:"seq"`
	Value     string        `json:"value,omitempty"`
	Checked   int64         `json:"checked,omitempty"`
	Deadline  int64         `json:"deadline,omitempty"`
	Call      int64         `json:"call,omitempty"`
	Outcome   fence.Outcome `json:"outcome,omitempty"`
	Current   fence.Token   `json:"current,omitempty"`
	LastValid int64         `json:"last_valid,omitempty"`
	How       string        `json:"how,omitempty"`
	Kind      string        `json:"kind,omitempty"`
	Target    string        `json:"target,omitempty"`
	End       int64         `json:"end,omitempty"`
	Err       string        `json:"err,omitempty"`
}

// How a grant ended (grantRec.How).
const (
	endReleased     = "released"
	endLost         = "lost"
	endReleaseError = "release-error"
	endKilled       = "killed"
)

// runWorker is the verify-worker command.
func runWorker(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) int {
	in := bufio.NewScanner(stdin)
	in.Buffer(make([]byte, 64<<10), 1<<20)
	var spec workerSpec
	if !in.Scan() || json.Unmarshal(in.Bytes(), &spec) != nil || spec.Worker == "" {
		fmt.Fprintln(stderr, "fencekit verify-worker: fencekit verify starts this command and sends it its work on stdin; it is not for direct use")
		return exitUsage
	}
	w := &worker{spec: spec, out: &eventOut{w: stdout}, plant: os.Getenv(plantVar)}
	return w.run(ctx, in)
}

type worker struct {
	spec  workerSpec
	out   *eventOut
	plant string
	g     guardStore
	seq   int
}

// eventOut writes events, one line each, from any goroutine.
type eventOut struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *eventOut) emit(e workerEvent) {
	b, _ := json.Marshal(e)
	o.mu.Lock()
	_, _ = o.w.Write(append(b, '\n'))
	o.mu.Unlock()
}

// rel is t in the run's time: nanoseconds since its start.
func (w *worker) rel(t time.Time) int64 { return t.UnixNano() - w.spec.Epoch }

func (w *worker) failed(err error) int {
	w.out.emit(workerEvent{Ev: evFailed, At: w.rel(time.Now()), Err: err.Error()})
	return exitFail
}

func (w *worker) run(ctx context.Context, in *bufio.Scanner) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	switch w.plant {
	case "", plantNoCompare, plantGrantHeld, plantPastDeadline:
	default:
		return w.failed(fmt.Errorf("unknown %s %q (%s, %s or %s)", plantVar, w.plant, plantNoCompare, plantGrantHeld, plantPastDeadline))
	}
	var vf verifyFlags
	fs := flag.NewFlagSet("fencekit verify-worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	vf.register(fs, func(k string) string { return w.spec.Env[k] })
	if err := fs.Parse(w.spec.Args); err != nil {
		return w.failed(err)
	}
	fs.Visit(func(f *flag.Flag) { vf.store.prefixSet = vf.store.prefixSet || f.Name == "prefix" })

	fnet := newFaultNet()
	defer fnet.stop()
	discard := slog.New(slog.DiscardHandler)
	vf.store.dial = fnet.dialer(targetLease)
	// ZooKeeper keeps a grant whose holder stopped or lost the ensemble
	// until its session expires: a session timeout equal to the TTL, as
	// zklease advises, makes a takeover wait one TTL, as on other stores.
	vf.store.sessionTimeout = w.spec.TTL
	octx, ocancel := context.WithTimeout(ctx, vf.store.timeout)
	b, kind, closeStore, err := vf.store.openStore(octx, discard)
	ocancel()
	if err != nil {
		return w.failed(err)
	}
	defer closeStore()
	var backend lease.Backend = b
	if w.plant == plantGrantHeld {
		backend = grantHeld{b}
	}
	ttl := w.spec.TTL
	m, err := lease.NewManager(backend, ttl, lease.WithIdentity("fencekit-verify/"+w.spec.Worker),
		lease.WithPollInterval(max(ttl/5, 20*time.Millisecond)), lease.WithReleaseTimeout(2*ttl+time.Second), lease.WithLogger(discard))
	if err != nil {
		return w.failed(err)
	}
	if err := vf.guard.resolve(kind); err != nil {
		return w.failed(err)
	}
	if w.g, err = vf.guard.open(ctx, fnet.dialer(targetGuard)); err != nil {
		return w.failed(err)
	}
	defer w.g.close()
	w.out.emit(workerEvent{Ev: evHello, At: w.rel(time.Now()), Pid: os.Getpid(), Plant: w.plant})

	// Commands, until stop, or until the run is gone (its end of the
	// pipe closed).
	stopping := make(chan struct{})
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopping); stopRun() }) }
	go func() {
		for in.Scan() {
			var c workerCmd
			if json.Unmarshal(in.Bytes(), &c) != nil {
				continue
			}
			switch c.Cmd {
			case "stop":
				stop()
			case "fault":
				start := time.Now()
				fnet.inject(c.Target, c.Kind, c.For, c.Latency)
				w.out.emit(workerEvent{Ev: evFault, Kind: c.Kind, Target: c.Target, At: w.rel(start), End: w.rel(start.Add(c.For))})
			}
		}
		stop()
		cancel() // the run is gone
	}()

	r := rand.New(rand.NewPCG(w.spec.Seed, 0x5eed))
	for runCtx.Err() == nil {
		w.grant(ctx, runCtx, m, r, stopping)
	}
	w.out.emit(workerEvent{Ev: evBye, At: w.rel(time.Now())})
	return exitOK
}

// grant takes the lease once, works under it and releases it.
func (w *worker) grant(ctx, runCtx context.Context, m *lease.Manager, r *rand.Rand, stopping <-chan struct{}) {
	ttl := w.spec.TTL
	actx, cancel := context.WithTimeout(runCtx, 4*ttl)
	l, err := m.Acquire(actx, w.spec.Lease)
	acquired := time.Now()
	cancel()
	if err != nil {
		if runCtx.Err() == nil && !errors.Is(err, lease.ErrNotAcquired) {
			w.out.emit(workerEvent{Ev: evError, At: w.rel(acquired), Err: err.Error()})
			sleepOr(stopping, 10*time.Millisecond)
		}
		return
	}
	tok := l.Token()
	w.out.emit(workerEvent{Ev: evAcquired, At: w.rel(acquired), Token: tok})

	// Work: a number of writes (about 0.2-1.5 TTL's worth, paused or
	// not). Before each write, read the lease, as a careful holder does;
	// think a little (a pause can fall here: the write then goes out late,
	// the case fencing is for); write through the guard, with a context
	// of its own, not the lease's, so that such a write reaches the store.
	var lastValid, lastDeadline int64 = -1, 0
	writes := max(2, int((0.2+1.3*r.Float64())*float64(ttl)/float64(workStep)))
	for range writes {
		if closed(stopping) {
			break
		}
		t0 := time.Now()
		ok, dl := w.valid(l, t0)
		if !ok {
			break
		}
		lastValid, lastDeadline = w.rel(t0), dl
		seq := w.seq
		w.seq++
		value := fmt.Sprintf("%s/%d/%d", w.spec.Worker, tok, seq)
		w.out.emit(workerEvent{Ev: evChecked, Seq: seq, Token: tok, Value: value, Checked: w.rel(t0), Deadline: dl, At: w.rel(t0)})
		time.Sleep(time.Duration(2+r.IntN(9)) * time.Millisecond)
		w.write(ctx, seq, tok, value)
		sleepOr(stopping, time.Duration(5+r.IntN(11))*time.Millisecond)
	}

	// Release, while a second goroutine keeps reading the lease: whatever
	// reads valid while Release runs belongs to the grant's window.
	var (
		released              = make(chan struct{})
		polled                = make(chan struct{})
		relValid, relDeadline = int64(-1), int64(0)
		rctx, rcancel         = context.WithTimeout(ctx, 2*ttl+time.Second)
	)
	go func() {
		defer close(polled)
		for {
			t0 := time.Now()
			if l.Err() != nil {
				return
			}
			relValid, relDeadline = w.rel(t0), w.rel(t0)+int64(l.Deadline().Sub(t0))
			select {
			case <-released:
				return
			default:
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	rerr := l.Release(rctx)
	rcancel()
	close(released)
	<-polled
	ended := time.Now()
	if relValid > lastValid {
		lastValid, lastDeadline = relValid, relDeadline
	}
	e := workerEvent{Ev: evEnded, At: w.rel(ended), Token: tok, LastValid: lastValid, Deadline: lastDeadline, How: endReleased}
	switch {
	case errors.Is(rerr, lease.ErrLost):
		e.How, e.Err = endLost, rerr.Error()
	case rerr != nil:
		e.How, e.Err = endReleaseError, rerr.Error()
	}
	w.out.emit(e)
}

// valid reads the lease at t0, and returns whether the worker takes it as
// valid and the lease's local deadline then (in the run's time).
func (w *worker) valid(l *lease.Lease, t0 time.Time) (bool, int64) {
	dl := w.rel(t0) + int64(l.Deadline().Sub(t0))
	if w.plant == plantPastDeadline {
		return true, dl
	}
	return l.Err() == nil, dl
}

// write writes value to the scratch resource with tok, and reports the
// write's call, return and outcome.
func (w *worker) write(ctx context.Context, seq int, tok fence.Token, value string) {
	call := time.Now()
	// Longer than the longest pause the run injects: a write paused before
	// it was sent goes out when the worker runs again.
	wctx, cancel := context.WithTimeout(ctx, 4*w.spec.TTL+time.Second)
	present := tok
	if w.plant == plantNoCompare {
		if cur, _, err := w.g.read(wctx, w.spec.Scratch); err == nil && cur > present {
			present = cur
		}
	}
	err := w.g.write(wctx, w.spec.Scratch, present, value)
	cancel()
	ret := time.Now()
	outcome, current := guardtest.Classify(err)
	e := workerEvent{Ev: evWrite, Seq: seq, Call: w.rel(call), At: w.rel(ret), Outcome: outcome, Current: current}
	if err != nil {
		e.Err = err.Error()
	}
	w.out.emit(e)
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sleepOr sleeps d, or until stop is closed.
func sleepOr(stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
	case <-t.C:
	}
}

// grantHeld is the planted bug plantGrantHeld: a backend that grants a
// held name, by revoking the holder's grant when another owner asks.
type grantHeld struct{ operator }

func (b grantHeld) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.operator.Acquire(ctx, req)
	if !errors.Is(err, driver.ErrNotAcquired) {
		return g, err
	}
	st, serr := b.Status(ctx, req.Name)
	if serr != nil || !st.Held() || st.Holder.Owner == req.Owner || b.Revoke(ctx, st.Holder) != nil {
		return g, err
	}
	return b.operator.Acquire(ctx, req)
}
