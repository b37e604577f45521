package etcdlease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// overlapChecker fails when two holders of one lease overlap, or when a
// grant's token is not greater than the one before.
type overlapChecker struct {
	mu     sync.Mutex
	holder string
	last   fence.Token
	grants int
	errs   []error
}

// begin records that who was granted the lease with token.
func (c *overlapChecker) begin(who string, token fence.Token) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holder != "" {
		c.errs = append(c.errs, fmt.Errorf("%s granted token %d while %s holds the lease", who, token, c.holder))
	}
	if token <= c.last {
		c.errs = append(c.errs, fmt.Errorf("%s granted token %d after token %d", who, token, c.last))
	}
	c.holder, c.last = who, token
	c.grants++
}

// end records that who stopped holding (before it sends its release).
func (c *overlapChecker) end(who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holder == who {
		c.holder = ""
	}
}

func (c *overlapChecker) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := errors.Join(c.errs...); err != nil {
		t.Fatal(err)
	}
}

// Exclusivity under contention from three clients, each connected to a
// different member: workers take one lease in turns, and the checker fails
// if two ever overlap or a token does not grow.
func TestExclusiveAcrossMembers(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	var managers []*lease.Manager
	for i := range cl.Members {
		managers = append(managers, testkit.NewManager(t, newBackend(t, cl.Client(cl.Endpoints(i)...), p), 5*time.Second))
	}
	const workers, rounds = 9, 10
	var chk overlapChecker
	// The 90 turns took more than testkit's minute at load 30 (the test
	// failed after 72 s): the property is exclusivity and every turn
	// taken, not throughput, so ctx only bounds a wait that, with a bug,
	// never ends.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := managers[w%len(managers)]
			who := fmt.Sprintf("worker %d (member %d)", w, w%len(managers))
			for range rounds {
				l, err := m.Acquire(ctx, "contended")
				if err != nil {
					errs <- fmt.Errorf("%s: Acquire: %w", who, err)
					return
				}
				chk.begin(who, l.Token())
				time.Sleep(time.Millisecond)
				if err := l.Err(); err != nil {
					errs <- fmt.Errorf("%s: lease ended while working: %w", who, err)
				}
				chk.end(who)
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("%s: Release: %w", who, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	chk.check(t)
	if chk.grants != workers*rounds {
		t.Fatalf("%d grants, want %d", chk.grants, workers*rounds)
	}
}

// The leader is killed (stopped) while leases are held and waiters wait:
//
//   - a live holder keeps its lease through the election, releases it
//     afterwards, and the waiter (woken by its watch, across the failover)
//     gets it with a greater token, never while the holder holds it. An
//     election can take longer than a short TTL allows (a starved member
//     misses the 100 ms election timeout, and the elections that follow
//     stall requests for seconds), and at TTL 1 s a loaded machine's
//     scheduling alone can use up the room: survival is then not
//     required (it is from TTL 3 s when the election was short), but the
//     loss must be safe: reported as ErrLost, and the waiter gets the
//     lease only from the holder's local deadline on, with a greater token;
//   - an abandoned grant (its holder died with the leader: never renewed,
//     never released) is taken over by its waiter only after it expired
//     at the store, and the time from the kill to the takeover is logged.
func TestLeaderKilled(t *testing.T) {
	for _, ttl := range []time.Duration{time.Second, 3 * time.Second} {
		t.Run(fmt.Sprintf("ttl=%v", ttl), func(t *testing.T) {
			testLeaderKilled(t, ttl)
		})
	}
}

func testLeaderKilled(t *testing.T, ttl time.Duration) {
	cl := etcdtest.Start(t, 3) // the Fast timing: elections within about 100-300 ms
	p := prefix(t)
	// Every client knows every member, so that it can fail over.
	holderM := testkit.NewManager(t, newBackend(t, cl.Client(), p), ttl)
	waiterM := testkit.NewManager(t, newBackend(t, cl.Client(), p), ttl)
	deadB := newBackend(t, cl.Client(), p)
	ctx := testkit.Context(t)

	var chk overlapChecker
	// Acquire, not TryAcquire: on a loaded machine a 1 s grant can arrive
	// past its local deadline and be given back; the next attempt gets it.
	held, err := holderM.Acquire(ctx, "held")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	chk.begin("holder", held.Token())
	deadSent := time.Now()
	dead, err := deadB.Acquire(ctx, driver.Request{Name: "abandoned", Owner: "dead-holder", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	before := max(held.Token(), dead.Token)

	heldWaiter, deadWaiter := testkit.AcquireAsync(ctx, waiterM, "held"), testkit.AcquireAsync(ctx, waiterM, "abandoned")
	time.Sleep(300 * time.Millisecond) // the waiters are refused and watch

	lead := cl.Leader()
	admin := cl.Client()
	// The holder's local deadline at the kill: a renewal confirmed from now
	// on only moves it later, so this is the least time the holder has to
	// get a renewal through the new leader.
	deadlineAtKill := held.Deadline()
	killed := time.Now()
	cl.Members[lead].Kill()
	newLead := cl.WaitLeader()
	// The raft term grows with every election: an unchanged term later
	// means that this was the only one. It is read before the election's
	// end is taken, so that an election over before the read counts in
	// the election's time, and one after it changes the term.
	term := raftTerm(t, admin, cl)
	elected := time.Now()
	t.Logf("leader m%d killed; m%d elected %v after the kill (term %d)", lead, newLead, elected.Sub(killed).Round(time.Millisecond), term)

	// The abandoned grant: taken over after it expired at the store.
	var took testkit.Acquired
	select {
	case took = <-deadWaiter:
	case <-time.After(ttl + 30*time.Second):
		t.Fatal("the abandoned lease was not taken over")
	}
	if took.Err != nil {
		t.Fatalf("waiter of the abandoned lease: %v", took.Err)
	}
	if took.At.Before(deadSent.Add(ttl)) {
		t.Errorf("the abandoned grant (sent %v before the kill, TTL %v) was taken over %v after the kill: before it could have expired",
			killed.Sub(deadSent), ttl, took.At.Sub(killed))
	}
	if took.Lease.Token() <= before {
		t.Errorf("token after the failover %d, not greater than %d before it", took.Lease.Token(), before)
	}
	t.Logf("TTL %v: abandoned grant taken over %v after the leader was killed (%v after it could first have expired)",
		ttl, took.At.Sub(killed).Round(time.Millisecond), took.At.Sub(deadSent.Add(ttl)).Round(time.Millisecond))
	_ = took.Lease.Release(ctx)

	// The live holder, through the failover. It must have kept its lease
	// if the election left it room to renew before its deadline: after the
	// election, the heartbeat that failed during it is retried within
	// RenewRetryInterval (a quarter of the renew interval), and the retry
	// needs a round trip through the new leader (the keep-alive forwarded
	// to it, the key check's read), on a loaded machine that also ran the
	// election late. So the room required is a renew interval (a quarter
	// for the retry, three quarters for the round trip and late timers:
	// 247 ms at TTL 1 s), and no less than the election itself took (a
	// machine that slow delays the renewal as much). With the default
	// options and heartbeats on time the deadline is at least
	// validity - renew interval = two renew intervals after the kill, so
	// survival is required whenever the election took at most a renew
	// interval, (validity - renew interval)/2: 329 ms at TTL 1 s, 989 ms
	// at 3 s; the Fast timing's elections take about 100-300 ms. The
	// requirement also needs that election to have been the only one: a
	// later one (a starved member missing the 100 ms election timeout)
	// stalls requests for seconds, which no TTL here survives.
	election := elected.Sub(killed)
	left := deadlineAtKill.Sub(elected)
	room := max(holderM.Options().RenewInterval, election)
	var r testkit.Acquired
	if heldErr := held.Err(); heldErr == nil {
		select {
		case early := <-heldWaiter:
			t.Fatalf("the waiter got the held lease while its holder held it: %v", early.Err)
		default:
		}
		chk.end("holder")
		released := time.Now()
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release after the failover: %v", err)
		}
		r = <-heldWaiter
		if r.Err != nil {
			t.Fatalf("waiter: %v", r.Err)
		}
		t.Logf("the held lease passed to its waiter %v after the release", r.At.Sub(released).Round(time.Millisecond))
	} else {
		termNow := raftTerm(t, admin, cl)
		// At TTL 1 s the room is a third of a second, which a machine
		// running other test binaries beside this one (load 12 to 15)
		// spent on scheduling the retry alone: the requirement is checked
		// from TTL 3 s, where the room (989 ms) is three times the
		// election's usual length; the 1 s case checks the loss is safe.
		if left >= room && termNow == term && ttl >= 3*time.Second {
			t.Fatalf("the holder lost its lease in the failover, though the election took %v and left %v before its deadline (%v needed for a renewal), and was the only one (term %d): %v",
				election.Round(time.Millisecond), left.Round(time.Millisecond), room.Round(time.Millisecond), term, heldErr)
		}
		if termNow != term {
			t.Logf("TTL %v: the holder lost its lease, after elections beyond the first (term %d after it, %d now): %v", ttl, term, termNow, heldErr)
		} else {
			t.Logf("TTL %v: the holder lost its lease: the election took %v, too long for a TTL of that size: it left %v before the holder's deadline, and a renewal needs %v: %v",
				ttl, election.Round(time.Millisecond), left.Round(time.Millisecond), room.Round(time.Millisecond), heldErr)
		}
		// The loss must be safe.
		if !errors.Is(heldErr, lease.ErrLost) {
			t.Errorf("Err of the holder's lost lease = %v, want ErrLost", heldErr)
		}
		if err := held.Release(ctx); !errors.Is(err, lease.ErrLost) {
			t.Errorf("Release of the lost lease = %v, want ErrLost", err)
		}
		select {
		case r = <-heldWaiter:
		case <-time.After(ttl + 30*time.Second):
			t.Fatal("the waiter did not get the lease its holder lost")
		}
		if r.Err != nil {
			t.Fatalf("waiter: %v", r.Err)
		}
		// The holder held the lease until its local deadline (a lost
		// lease's deadline no longer moves). The waiter's Acquire returned
		// after the store granted it: returning before the deadline is
		// proof of an overlap, which the checker then reports.
		dl := held.Deadline()
		if !r.At.Before(dl) {
			chk.end("holder")
		}
		t.Logf("the lost lease passed to its waiter %v after the holder's deadline", r.At.Sub(dl).Round(time.Millisecond))
	}
	chk.begin("waiter", r.Lease.Token())
	chk.check(t)
	if r.Lease.Token() <= held.Token() {
		t.Errorf("waiter's token %d is not greater than the holder's %d", r.Lease.Token(), held.Token())
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// raftTerm returns the highest raft term among cl's running members, as
// they report it (a member's status is served without raft).
func raftTerm(t *testing.T, cli *clientv3.Client, cl *etcdtest.Cluster) uint64 {
	t.Helper()
	var term uint64
	for i, m := range cl.Members {
		if !m.Running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := cli.Status(ctx, m.Endpoint())
		cancel()
		if err != nil {
			t.Fatalf("status of m%d: %v", i, err)
		}
		term = max(term, st.RaftTerm)
	}
	return term
}

// The whole cluster is stopped and started again: tokens keep growing.
func TestTokensGrowAcrossClusterRestart(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	m := testkit.NewManager(t, newBackend(t, cl.Client(), p), 2*time.Second)
	ctx := testkit.Context(t)
	var last fence.Token
	cycle := func(when string) {
		t.Helper()
		for i := range 3 {
			l, err := m.Acquire(ctx, "job")
			if err != nil {
				t.Fatalf("%s: Acquire: %v", when, err)
			}
			if l.Token() <= last {
				t.Fatalf("%s, grant %d: token %d is not greater than %d", when, i, l.Token(), last)
			}
			last = l.Token()
			if err := l.Release(ctx); err != nil {
				t.Fatalf("%s: Release: %v", when, err)
			}
		}
	}
	cycle("before the restart")
	for i := range 2 {
		before := last
		cl.StopAll()
		cl.StartAll()
		cycle(fmt.Sprintf("after restart %d", i+1))
		t.Logf("restart %d: token %d before, %d after", i+1, before, last)
	}
}

// Tokens after the cluster is restored from a backup of its data
// directories (revisions go back): a backend that saw the later grants
// notices the rewind and starts a new epoch; a new process cannot tell,
// and gets greater tokens once the operator deleted the epoch key, as the
// package documentation asks.
func TestTokensGrowAfterRestoreFromBackup(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	b := newBackend(t, cl.Client(), p)
	m := testkit.NewManager(t, b, 2*time.Second)
	ctx := testkit.Context(t)
	cycle := func(m *lease.Manager, n int) fence.Token {
		t.Helper()
		var last fence.Token
		for range n {
			l, err := m.Acquire(ctx, "job")
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if l.Token() <= last {
				t.Fatalf("token %d after %d", l.Token(), last)
			}
			last = l.Token()
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
		return last
	}
	cycle(m, 2)
	restore := cl.Backup()
	high := cycle(m, 5)
	restore()
	if got := cycle(m, 1); got <= high {
		t.Fatalf("the same backend after the restore: token %d, not greater than %d granted before it", got, high)
	} else {
		t.Logf("restore seen by the same backend: token %d before, %d after", high, got)
	}

	// A new process after a second restore, with the operator's step.
	restore = cl.Backup()
	high = cycle(m, 5)
	restore()
	admin := cl.Client()
	if _, err := admin.Delete(ctx, b.EpochKey()); err != nil {
		t.Fatalf("deleting the epoch key: %v", err)
	}
	fresh := testkit.NewManager(t, newBackend(t, cl.Client(), p), 2*time.Second)
	if got := cycle(fresh, 1); got <= high {
		t.Fatalf("a new backend after the restore and the epoch key's deletion: token %d, not greater than %d", got, high)
	} else {
		t.Logf("restore, epoch key deleted, new backend: token %d before, %d after", high, got)
	}
}
