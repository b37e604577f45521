package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// jobLog is a JobObserver and an ElectionObserver that records job and
// election events in the order they came, as "started NAME TOKEN",
// "ended NAME TOKEN released|lost", "elected ..." and "deposed ...", with
// the virtual time of each end and what the work's context said then.
type jobLog struct {
	lease.NopObserver
	mu      sync.Mutex
	events  []string
	endedAt []time.Time
	// work is the context of the job's function while it runs, and
	// workLiveAtEnd what its Err was at each JobEnded.
	work          context.Context
	workLiveAtEnd []bool
	// running is set while a job's function runs: started must come
	// before, and an end that is not a loss after it.
	running        bool
	runningAtStart []bool
}

func (j *jobLog) add(s string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, s)
}

func (j *jobLog) JobStarted(e lease.JobEvent) {
	j.mu.Lock()
	j.runningAtStart = append(j.runningAtStart, j.running)
	j.mu.Unlock()
	j.add(fmt.Sprintf("started %s %d", e.Name, e.Token))
}

func (j *jobLog) JobEnded(e lease.JobEvent) {
	j.mu.Lock()
	j.endedAt = append(j.endedAt, time.Now())
	j.workLiveAtEnd = append(j.workLiveAtEnd, j.work != nil && j.work.Err() == nil)
	j.mu.Unlock()
	j.add(fmt.Sprintf("ended %s %d %s", e.Name, e.Token, errName(e.Err)))
}

func (j *jobLog) Elected(e lease.ElectionEvent) {
	j.add(fmt.Sprintf("elected %s %d", e.Election, e.Token))
}

func (j *jobLog) Deposed(e lease.ElectionEvent) {
	j.add(fmt.Sprintf("deposed %s %d %s", e.Election, e.Token, errName(e.Err)))
}

// job returns a job function that records it runs, and then calls work.
func (j *jobLog) job(work func(ctx context.Context, l *lease.Lease) error) func(context.Context, *lease.Lease) error {
	return func(ctx context.Context, l *lease.Lease) error {
		j.mu.Lock()
		j.running, j.work = true, ctx
		j.mu.Unlock()
		defer func() {
			j.mu.Lock()
			j.running, j.work = false, nil
			j.mu.Unlock()
		}()
		if work == nil {
			return nil
		}
		return work(ctx, l)
	}
}

func (j *jobLog) got() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.events...)
}

func sameEvents(t *testing.T, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events:\n got %q\nwant %q", got, want)
	}
}

// Run, TryRun and RunOnce each report their job under the lease name
// they were given, with the lease's token: started before the function
// runs, ended (released) once it returned, before Run returns. RunOnce
// reports a job also when the ledger finds the run done.
func TestJobObserverHearsRunTryRunAndRunOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &jobLog{}
		// Through Observers, with an observer that hears no jobs beside it.
		m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(lease.Observers{lease.NopObserver{}, log}))
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		var toks []fence.Token
		keep := func(ctx context.Context, l *lease.Lease) error { toks = append(toks, l.Token()); return nil }
		if err := m.Run(ctx, "nightly", log.job(keep)); err != nil {
			t.Fatal(err)
		}
		if err := m.TryRun(ctx, "hourly", log.job(keep)); err != nil {
			t.Fatal(err)
		}
		led := &memLedger{newest: map[string]fence.Token{}, done: map[string]fence.Token{}}
		for range 2 { // the second finds the run done and does not call the function
			if _, err := m.RunOnce(ctx, "settle-orders", "2026-12-01", led, log.job(keep)); err != nil {
				t.Fatal(err)
			}
		}
		if len(toks) != 3 {
			t.Fatalf("the job functions ran %d times, want 3", len(toks))
		}
		got := log.got()
		if len(got) != 8 {
			t.Fatalf("events %q, want 4 jobs", got)
		}
		onceTok := got[6][len("started settle-orders "):] // the second RunOnce's own grant
		sameEvents(t, got, []string{
			fmt.Sprintf("started nightly %d", toks[0]), fmt.Sprintf("ended nightly %d released", toks[0]),
			fmt.Sprintf("started hourly %d", toks[1]), fmt.Sprintf("ended hourly %d released", toks[1]),
			fmt.Sprintf("started settle-orders %d", toks[2]), fmt.Sprintf("ended settle-orders %d released", toks[2]),
			"started settle-orders " + onceTok, "ended settle-orders " + onceTok + " released",
		})
		for i, running := range log.runningAtStart {
			if running {
				t.Fatalf("job %d: JobStarted came while its function ran, want before", i)
			}
		}
	})
}

// A job whose lease is lost is reported ended at the lease's local
// deadline, before the lease's context is cancelled, although its
// function ignores the context and runs on: the gauge follows the lease,
// not the function.
func TestJobEndedAtTheLossNotWhenTheFunctionReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &jobLog{}
		b := &flakyRenew{Backend: memlease.New()}
		m, err := lease.NewManager(b, time.Second, lease.WithObserver(log), lease.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		var (
			deadline time.Time
			returned time.Time
			tok      fence.Token
		)
		err = m.Run(t.Context(), "nightly", log.job(func(ctx context.Context, l *lease.Lease) error {
			b.fail.Store(true) // every renewal fails from now: the lease runs out
			deadline, tok = l.Deadline(), l.Token()
			time.Sleep(5 * time.Second) // work that ignores its context
			returned = time.Now()
			return nil
		}))
		b.fail.Store(false)
		if !errors.Is(err, lease.ErrLost) {
			t.Fatalf("Run = %v, want the loss", err)
		}
		sameEvents(t, log.got(), []string{fmt.Sprintf("started nightly %d", tok), fmt.Sprintf("ended nightly %d lost", tok)})
		if at := log.endedAt[0]; at.After(deadline) || !at.Before(returned) {
			t.Fatalf("JobEnded at %v; the local deadline was %v and the function returned at %v: want at the deadline", at, deadline, returned)
		}
		if !log.workLiveAtEnd[0] {
			t.Fatal("the job's context was cancelled before JobEnded was reported, want after")
		}
	})
}

// An election's term is a job under the election's name: Elected, then
// JobStarted; JobEnded, then Deposed; term after term.
func TestElectionTermIsAJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &jobLog{}
		m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(log))
		if err != nil {
			t.Fatal(err)
		}
		e, err := lease.NewElection(m, "scheduler", lease.WithBackoff(time.Second, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var toks []fence.Token
		err = e.Run(ctx, log.job(func(ctx context.Context, l *lease.Lease) error {
			toks = append(toks, l.Token())
			if len(toks) == 2 {
				cancel()
			}
			return nil
		}))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
		var want []string
		for _, tok := range toks {
			want = append(want, fmt.Sprintf("elected scheduler %d", tok), fmt.Sprintf("started scheduler %d", tok),
				fmt.Sprintf("ended scheduler %d released", tok), fmt.Sprintf("deposed scheduler %d released", tok))
		}
		sameEvents(t, log.got(), want)
	})
}

// Semaphore.Run reports its job under the semaphore's name, with the
// permit's token.
func TestSemaphoreRunIsAJobUnderTheSemaphoresName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &jobLog{}
		m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(log))
		if err != nil {
			t.Fatal(err)
		}
		s, err := lease.NewSemaphore(m, "crawlers", 2)
		if err != nil {
			t.Fatal(err)
		}
		var tok fence.Token
		if err := s.Run(t.Context(), log.job(func(_ context.Context, l *lease.Lease) error { tok = l.Token(); return nil })); err != nil {
			t.Fatal(err)
		}
		sameEvents(t, log.got(), []string{fmt.Sprintf("started crawlers %d", tok), fmt.Sprintf("ended crawlers %d released", tok)})
	})
}

// A job whose function panics is reported ended before the panic leaves
// Run: the gauge does not stay up for a job that is gone.
func TestJobEndedBeforeAPanicLeavesRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &jobLog{}
		m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(log))
		if err != nil {
			t.Fatal(err)
		}
		var atPanic []string
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("Run did not pass the panic on")
				}
				atPanic = log.got()
			}()
			_ = m.Run(t.Context(), "nightly", log.job(func(context.Context, *lease.Lease) error { panic("job failed") }))
		}()
		if len(atPanic) != 2 || atPanic[1][:len("ended nightly")] != "ended nightly" {
			t.Fatalf("events when the panic left Run: %q, want started and ended", atPanic)
		}
	})
}
