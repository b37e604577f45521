package redislease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// hub multiplexes release notifications for any number of waiters over few
// pub/sub connections, created on first use and closed when no one waits.
//
// It speaks one of two kinds of pub/sub, chosen once per hub (pubsubMode):
//
//   - Classic (SUBSCRIBE, and PUBLISH in release.lua). On a Redis Cluster
//     every PUBLISH is sent over the cluster bus to every node, so one
//     connection to any node hears every channel, and every release costs
//     every node a message.
//   - Sharded (SSUBSCRIBE, and SPUBLISH in the release script; Redis 7.0+).
//     An SPUBLISH goes only to the nodes of its channel's shard, so a release
//     costs one shard, and a subscriber must be connected to that shard. With
//     a Cluster client the hub keeps one connection per hash slot that has
//     waiters (the channels of one lease share a slot through their hash
//     tag): go-redis routes a pub/sub connection by its first channel and,
//     after a reconnect, subscribes all of its channels again in one
//     SSUBSCRIBE, which Redis refuses across slots (CROSSSLOT). When a slot
//     moves (a failover, a resharding) the node that served it unsubscribes
//     its subscribers (an "sunsubscribe" push that the hub did not ask for);
//     the hub then reconnects that slot's connection, through the client's
//     reloaded slot map, and wakes its waiters, since a release may have
//     been missed meanwhile.
//
// A channel's subscription is shared by its waiters, so no waiter's context
// may bound it: SUBSCRIBE and UNSUBSCRIBE run under the hub's own bounded
// context, and a waiter whose context ends just leaves. A connection's opMu
// orders those writes with the bookkeeping, so that an UNSUBSCRIBE for
// waiters that left can never overtake the SUBSCRIBE of a waiter that came
// after them. A waiter does not wait for a confirmation longer than
// confirmTimeout: go-redis drops error replies to (S)SUBSCRIBE (a MOVED from
// a node that no longer serves the slot, an ACL refusal), and a waiter must
// then poll rather than hang.
type hub struct {
	c Client
	// classic: SUBSCRIBE always (Options.ClassicPubSub); otherwise SSUBSCRIBE
	// if the server knows SPUBLISH (asked once, at the first watch), as the
	// release script publishes with SPUBLISH where the server has it.
	classic bool

	probeMu sync.Mutex // serialises the probe for SPUBLISH
	wg      sync.WaitGroup

	mu       sync.Mutex
	resolved bool // sharded and perSlot are known
	sharded  bool // SSUBSCRIBE rather than SUBSCRIBE
	perSlot  bool // one connection per hash slot (sharded, Cluster client)
	conns    map[int]*psConn
	closed   bool
	closing  chan struct{} // closed by close, to cut a reconnect's backoff short
	watching bool          // the watchdog runs (Cluster clients only)
}

// subscribeTimeout bounds one SUBSCRIBE or UNSUBSCRIBE sent by the hub.
const subscribeTimeout = 10 * time.Second

// confirmTimeout bounds how long a waiter waits for Redis to confirm a
// subscription, and how long a reconnected sharded connection may go
// without any confirmation before it is reconnected again. A variable for
// the tests.
var confirmTimeout = 2 * time.Second

// healthInterval is how often a hub over a Cluster client checks that each
// of its connections can be reached. A variable for the tests.
var healthInterval = time.Second

// Reconnects of a sharded connection back off from reconnectMin, doubling
// up to reconnectMax, while they get no confirmation.
const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 2 * time.Second
)

// psConn is one pub/sub connection and the channels subscribed over it.
// Every field but opMu is guarded by hub.mu.
type psConn struct {
	key  int        // its key in hub.conns: the hash slot, or 0
	opMu sync.Mutex // held while sending (S)SUBSCRIBE or (S)UNSUBSCRIBE, and while reconnecting

	ps    *redis.PubSub // nil while a reconnect waits
	subs  map[string]*channelSubs
	unsub map[string]int // our own UNSUBSCRIBEs not yet confirmed, per channel

	confirmed  bool // a subscription was confirmed on ps
	listening  bool // ps has its receive loop
	failures   int  // reconnects in a row without a confirmation
	reconnects bool // a reconnect is scheduled or running
}

type channelSubs struct {
	ready   chan struct{} // closed once SUBSCRIBE is confirmed, or failed
	isReady bool
	err     error
	waiters []chan struct{} // in the order they began to watch
	// inLine is set once a waiter of the channel's lease was refused in
	// line (driver.Request.Queue): a release then wakes the waiters one at
	// a time, in order, each refused one passing the wake on (passWake), at
	// most passes more times from next.
	inLine       bool
	passes, next int
}

// errNotConfirmed is returned by watch when Redis did not confirm the
// subscription within confirmTimeout.
var errNotConfirmed = errors.New("redislease: subscription not confirmed")

// newHub returns a hub; classic makes it use SUBSCRIBE whatever the server.
func newHub(c Client, classic bool) *hub {
	return &hub{c: c, classic: classic, conns: make(map[int]*psConn), closing: make(chan struct{})}
}

// resolve decides, once, which pub/sub the hub speaks.
func (h *hub) resolve(ctx context.Context) error {
	h.mu.Lock()
	done := h.resolved
	h.mu.Unlock()
	if done {
		return nil
	}
	h.probeMu.Lock()
	defer h.probeMu.Unlock()
	h.mu.Lock()
	done = h.resolved
	h.mu.Unlock()
	if done {
		return nil
	}
	sharded := false
	if !h.classic {
		has, err := hasSPublish(ctx, h.c)
		if err != nil {
			return err
		}
		sharded = has
	}
	_, cluster := h.c.(stateReloader)
	h.mu.Lock()
	h.resolved, h.sharded, h.perSlot = true, sharded, sharded && cluster
	h.mu.Unlock()
	return nil
}

// hasSPublish asks the server whether it knows SPUBLISH (Redis 7.0+), in
// one round trip. A server that refuses COMMAND counts as not knowing it.
func hasSPublish(ctx context.Context, c Client) (bool, error) {
	var cmd *redis.Cmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = p.Do(ctx, "COMMAND", "INFO", "SPUBLISH")
		return nil
	})
	if err == nil {
		err = cmd.Err()
	}
	var re redis.Error
	switch {
	case errors.As(err, &re):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("redislease: asking the server whether it has sharded pub/sub: %w", err)
	}
	infos, _ := cmd.Val().([]any)
	return len(infos) == 1 && infos[0] != nil, nil
}

// key returns the hub.conns key of channel; mu must be held.
func (h *hub) key(channel string) int {
	if h.perSlot {
		return slotOf(channel)
	}
	return 0
}

// newPubSub opens an empty subscription (no I/O: the connection is made by
// the first (S)SUBSCRIBE, routed by its channel); mu must be held.
func (h *hub) newPubSub() *redis.PubSub {
	if h.sharded {
		return h.c.SSubscribe(context.Background())
	}
	return h.c.Subscribe(context.Background())
}

func (h *hub) send(ps *redis.PubSub, ctx context.Context, subscribe bool, channel string) error {
	switch {
	case h.sharded && subscribe:
		return ps.SSubscribe(ctx, channel)
	case h.sharded:
		return ps.SUnsubscribe(ctx, channel)
	case subscribe:
		return ps.Subscribe(ctx, channel)
	default:
		return ps.Unsubscribe(ctx, channel)
	}
}

// start gives pc a new PubSub, without a connection yet; mu must be held.
func (h *hub) start(pc *psConn) {
	pc.ps = h.newPubSub()
	pc.confirmed, pc.listening = false, false
	pc.unsub = make(map[string]int)
}

// listen starts the receive loop of ps, once its first (S)SUBSCRIBE has
// opened its connection. Not before: receiving on a PubSub without a
// connection opens one, and a Cluster client routes a connection without
// channels to a random node, which would refuse (MOVED) every SSUBSCRIBE
// sent over it.
func (h *hub) listen(pc *psConn, ps *redis.PubSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if pc.ps != ps || pc.listening || h.closed {
		return
	}
	pc.listening = true
	h.wg.Add(1)
	go h.loop(pc, ps, ps.ChannelWithSubscriptions())
}

func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	if err := h.resolve(ctx); err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, ErrClosed
	}
	key := h.key(channel)
	pc := h.conns[key]
	if pc == nil {
		pc = &psConn{key: key, subs: make(map[string]*channelSubs)}
		h.conns[key] = pc
		h.start(pc)
		if _, cluster := h.c.(stateReloader); cluster && !h.watching {
			h.watching = true
			h.wg.Add(1)
			go h.watchdog()
		}
	}
	cs := pc.subs[channel]
	if cs == nil {
		cs = &channelSubs{ready: make(chan struct{})}
		pc.subs[channel] = cs
		h.wg.Add(1)
		go h.subscribe(pc, channel, cs)
	}
	w := make(chan struct{}, 1)
	cs.waiters = append(cs.waiters, w)
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.detach(pc, channel, cs, w) }) }
	timer := time.NewTimer(confirmTimeout)
	defer timer.Stop()
	select {
	case <-cs.ready:
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	case <-timer.C:
		stop()
		h.mu.Lock()
		if h.sharded {
			// Most likely the node no longer serves the slot.
			h.reconnectLater(pc)
		}
		h.mu.Unlock()
		return nil, nil, fmt.Errorf("%w within %v: channel %q", errNotConfirmed, confirmTimeout, channel)
	}
	if cs.err != nil {
		stop()
		return nil, nil, cs.err
	}
	return w, stop, nil
}

// subscribe sends (S)SUBSCRIBE for a new channel entry; the receive loop
// marks it ready on confirmation. On failure every waiter of the entry gets
// the error, the entry is dropped so that later waiters try afresh, and the
// channel is unsubscribed (go-redis keeps a channel whose SUBSCRIBE failed,
// and would subscribe it again on reconnect).
func (h *hub) subscribe(pc *psConn, channel string, cs *channelSubs) {
	defer h.wg.Done()
	pc.opMu.Lock()
	defer pc.opMu.Unlock()
	h.mu.Lock()
	current := pc.subs[channel] == cs && h.conns[pc.key] == pc && !h.closed
	ps := pc.ps
	h.mu.Unlock()
	if !current || ps == nil {
		// Every waiter left before we got here, or the hub closed, or the
		// connection is being replaced (the reconnect subscribes every
		// channel of the connection).
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	err := h.send(ps, ctx, true, channel)
	if err == nil {
		h.listen(pc, ps)
		return
	}
	h.mu.Lock()
	if !cs.isReady {
		cs.err, cs.isReady = err, true
		close(cs.ready)
	}
	if pc.subs[channel] == cs {
		delete(pc.subs, channel)
	}
	closed := h.closed
	h.mu.Unlock()
	if !closed {
		h.mu.Lock()
		pc.unsub[channel]++
		h.mu.Unlock()
		_ = h.send(ps, ctx, false, channel)
	}
}

// detach removes one waiter, and unsubscribes when the channel has no
// waiter left and no newer entry.
func (h *hub) detach(pc *psConn, channel string, cs *channelSubs, w chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs.waiters = slices.DeleteFunc(cs.waiters, func(x chan struct{}) bool { return x == w })
	if cs.inLine && len(w) > 0 {
		// It leaves with a wake it did not take: the next in line gets it.
		for _, x := range cs.waiters {
			if len(x) == 0 {
				wake(x)
				break
			}
		}
	}
	if len(cs.waiters) == 0 && pc.subs[channel] == cs {
		delete(pc.subs, channel)
		// In the background: a waiter leaving must not wait on the network.
		h.wg.Add(1)
		go h.unsubscribe(pc, channel)
	}
}

// unsubscribe ends the subscription of a channel whose last waiter left,
// unless a waiter came meanwhile and made a new entry: that one is (or will
// be) subscribed after us, so the channel must stay subscribed. A per-slot
// connection left without channels is closed instead.
func (h *hub) unsubscribe(pc *psConn, channel string) {
	defer h.wg.Done()
	pc.opMu.Lock()
	defer pc.opMu.Unlock()
	h.mu.Lock()
	if pc.subs[channel] != nil || h.closed || h.conns[pc.key] != pc {
		h.mu.Unlock()
		return
	}
	ps := pc.ps
	if h.perSlot && len(pc.subs) == 0 {
		delete(h.conns, pc.key)
		h.mu.Unlock()
		_ = ps.Close()
		return
	}
	pc.unsub[channel]++
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	_ = h.send(ps, ctx, false, channel)
}

// reconnectLater schedules a reconnect of a sharded connection, unless one
// is scheduled already; mu must be held.
func (h *hub) reconnectLater(pc *psConn) {
	if pc.reconnects || h.closed || h.conns[pc.key] != pc {
		return
	}
	pc.reconnects = true
	h.wg.Add(1)
	go h.reconnect(pc)
}

// reconnect replaces the PubSub of a sharded connection whose node stopped
// serving its slot (or never confirmed): it asks a Cluster client to reload
// its slot map, waits a backoff, opens a new PubSub (routed through the
// reloaded map) and subscribes every channel again. The confirmations wake
// the waiters. If none comes within confirmTimeout, it reconnects again.
func (h *hub) reconnect(pc *psConn) {
	defer h.wg.Done()
	pc.opMu.Lock()
	defer pc.opMu.Unlock()
	h.mu.Lock()
	if h.closed || h.conns[pc.key] != pc {
		pc.reconnects = false
		h.mu.Unlock()
		return
	}
	old := pc.ps
	pc.ps = nil // the old loop's last messages are ignored from now on
	backoff := min(reconnectMin<<min(pc.failures, 10), reconnectMax)
	pc.failures++
	h.mu.Unlock()
	_ = old.Close()
	if r, ok := h.c.(stateReloader); ok {
		r.ReloadState(context.Background())
	}
	select {
	case <-time.After(backoff):
	case <-h.closing:
	}
	h.mu.Lock()
	pc.reconnects = false
	if h.closed || h.conns[pc.key] != pc {
		h.mu.Unlock()
		return
	}
	h.start(pc)
	ps := pc.ps
	channels := make([]string, 0, len(pc.subs))
	for ch := range pc.subs {
		channels = append(channels, ch)
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	for _, ch := range channels {
		if err := h.send(ps, ctx, true, ch); err != nil {
			break // the connection failed: the check below reconnects
		}
		h.listen(pc, ps)
	}
	time.AfterFunc(confirmTimeout, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if pc.ps == ps && !pc.confirmed && len(pc.subs) > 0 {
			h.reconnectLater(pc)
		}
	})
}

// watchdog checks, every healthInterval while the hub has connections, that
// each of them can be reached (PING over it), for a hub over a Cluster
// client. When the node of a connection dies, go-redis reconnects it through
// its slot map, which still names the dead node until something reloads it
// (see withSlotReload); a hub whose process sends no other request to that
// slot would wait for go-redis's periodic reload (a minute by default)
// before it hears a release again. A failed PING makes the client reload
// its slot map and the hub reconnect the connection, which wakes its waiters
// once subscribed again.
func (h *hub) watchdog() {
	defer h.wg.Done()
	tick := time.NewTicker(healthInterval)
	defer tick.Stop()
	for {
		select {
		case <-h.closing:
			return
		case <-tick.C:
		}
		h.mu.Lock()
		if len(h.conns) == 0 || h.closed {
			h.watching = false
			h.mu.Unlock()
			return
		}
		type check struct {
			pc *psConn
			ps *redis.PubSub
		}
		var checks []check
		for _, pc := range h.conns {
			if pc.ps != nil && pc.listening {
				checks = append(checks, check{pc, pc.ps})
			}
		}
		h.mu.Unlock()
		for _, c := range checks {
			ctx, cancel := context.WithTimeout(context.Background(), healthInterval)
			err := c.ps.Ping(ctx)
			cancel()
			if err == nil {
				continue
			}
			h.mu.Lock()
			if c.pc.ps == c.ps {
				h.reconnectLater(c.pc)
			}
			h.mu.Unlock()
		}
	}
}

// loop receives the messages of one PubSub of pc until it is closed.
func (h *hub) loop(pc *psConn, ps *redis.PubSub, msgs <-chan any) {
	defer h.wg.Done()
	for msg := range msgs {
		h.mu.Lock()
		if pc.ps != ps {
			h.mu.Unlock()
			continue // a replaced connection's last words
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			cs := pc.subs[m.Channel]
			switch m.Kind {
			case "subscribe", "ssubscribe":
				pc.confirmed, pc.failures = true, 0
				if cs == nil {
					break
				}
				if !cs.isReady {
					cs.isReady = true
					close(cs.ready)
				} else {
					// A resubscription after a reconnect: a release may
					// have been missed, so let the waiters look again.
					signal(cs)
				}
			case "sunsubscribe":
				if pc.unsub[m.Channel] > 0 {
					pc.unsub[m.Channel]--
					break
				}
				if cs != nil {
					// The server dropped a channel we still want: its slot
					// moved to another node. Wake the waiters (they look
					// again) and subscribe through the slot's new node.
					signal(cs)
					h.reconnectLater(pc)
				}
			case "unsubscribe":
				if pc.unsub[m.Channel] > 0 {
					pc.unsub[m.Channel]--
				}
			}
		case *redis.Message:
			if cs := pc.subs[m.Channel]; cs != nil {
				if cs.inLine && len(cs.waiters) > 0 {
					// Only the first in line can win: wake the waiters in
					// the order they began to watch (the line's), one at
					// a time.
					cs.passes, cs.next = len(cs.waiters)-1, 1
					wake(cs.waiters[0])
				} else {
					signal(cs)
				}
			}
		}
		h.mu.Unlock()
	}
}

func signal(cs *channelSubs) {
	for _, w := range cs.waiters {
		wake(w)
	}
}

func wake(w chan struct{}) {
	select {
	case w <- struct{}{}:
	default:
	}
}

// inLine notes that a waiter of channel's lease waits in line
// (driver.Request.Queue) and, when passOn is set (it was refused for a
// waiter ahead while the lease was free), wakes the next of the channel's
// waiters, if the last release has wakes left to pass on.
func (h *hub) inLine(channel string, passOn bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	pc := h.conns[h.key(channel)]
	if pc == nil {
		return
	}
	cs := pc.subs[channel]
	if cs == nil {
		return
	}
	cs.inLine = true
	if passOn && cs.passes > 0 && cs.next < len(cs.waiters) {
		cs.passes--
		wake(cs.waiters[cs.next])
		cs.next++
	}
}

func (h *hub) close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.closing)
	var pss []*redis.PubSub
	for _, pc := range h.conns {
		if pc.ps != nil {
			pss = append(pss, pc.ps)
		}
		for _, cs := range pc.subs {
			if !cs.isReady {
				cs.err, cs.isReady = ErrClosed, true
				close(cs.ready)
			}
		}
	}
	h.mu.Unlock()
	var errs []error
	for _, ps := range pss {
		if err := ps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	h.wg.Wait()
	return errors.Join(errs...)
}
