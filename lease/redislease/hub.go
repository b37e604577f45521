package redislease

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// hub multiplexes release notifications for any number of waiters over one
// pub/sub connection, created on first use.
//
// A channel's subscription is shared by its waiters, so no waiter's context
// may bound it: SUBSCRIBE and UNSUBSCRIBE run under the hub's own bounded
// context, and a waiter whose context ends just leaves. opMu orders those
// writes with the bookkeeping, so that an UNSUBSCRIBE for waiters that left
// can never overtake the SUBSCRIBE of a waiter that came after them.
type hub struct {
	c Client

	opMu sync.Mutex // held while sending SUBSCRIBE or UNSUBSCRIBE
	wg   sync.WaitGroup

	mu     sync.Mutex
	ps     *redis.PubSub
	done   chan struct{} // closed when the receive loop ends
	subs   map[string]*channelSubs
	closed bool
}

// subscribeTimeout bounds one SUBSCRIBE or UNSUBSCRIBE sent by the hub.
const subscribeTimeout = 10 * time.Second

type channelSubs struct {
	ready   chan struct{} // closed once SUBSCRIBE is confirmed, or failed
	isReady bool
	err     error
	waiters map[chan struct{}]struct{}
}

func newHub(c Client) *hub {
	return &hub{c: c, subs: make(map[string]*channelSubs)}
}

func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, ErrClosed
	}
	if h.ps == nil {
		h.ps = h.c.Subscribe(context.WithoutCancel(ctx)) // no channels yet: no I/O
		h.done = make(chan struct{})
		go h.loop(h.ps.ChannelWithSubscriptions(), h.done)
	}
	cs := h.subs[channel]
	if cs == nil {
		cs = &channelSubs{ready: make(chan struct{}), waiters: make(map[chan struct{}]struct{})}
		h.subs[channel] = cs
		h.wg.Add(1)
		go h.subscribe(h.ps, channel, cs)
	}
	w := make(chan struct{}, 1)
	cs.waiters[w] = struct{}{}
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.detach(channel, cs, w) }) }
	select {
	case <-cs.ready:
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
	if cs.err != nil {
		stop()
		return nil, nil, cs.err
	}
	return w, stop, nil
}

// subscribe sends SUBSCRIBE for a new channel entry; the receive loop marks
// it ready on confirmation. On failure every waiter of the entry gets the
// error, the entry is dropped so that later waiters try afresh, and the
// channel is unsubscribed (go-redis keeps a channel whose SUBSCRIBE failed,
// and would subscribe it again on reconnect).
func (h *hub) subscribe(ps *redis.PubSub, channel string, cs *channelSubs) {
	defer h.wg.Done()
	h.opMu.Lock()
	defer h.opMu.Unlock()
	h.mu.Lock()
	current := h.subs[channel] == cs && !h.closed
	h.mu.Unlock()
	if !current {
		return // every waiter left before we got here (or the hub closed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	err := ps.Subscribe(ctx, channel)
	if err == nil {
		return
	}
	h.mu.Lock()
	if !cs.isReady {
		cs.err, cs.isReady = err, true
		close(cs.ready)
	}
	if h.subs[channel] == cs {
		delete(h.subs, channel)
	}
	closed := h.closed
	h.mu.Unlock()
	if !closed {
		_ = ps.Unsubscribe(ctx, channel)
	}
}

// detach removes one waiter, and unsubscribes when the channel has no
// waiter left and no newer entry.
func (h *hub) detach(channel string, cs *channelSubs, w chan struct{}) {
	h.mu.Lock()
	delete(cs.waiters, w)
	last := len(cs.waiters) == 0 && h.subs[channel] == cs
	if last {
		delete(h.subs, channel)
	}
	if last {
		// In the background: a waiter leaving must not wait on the network.
		h.wg.Add(1)
		go h.unsubscribe(channel)
	}
	h.mu.Unlock()
}

// unsubscribe sends UNSUBSCRIBE for a channel whose last waiter left, unless
// a waiter came meanwhile and made a new entry: that one is (or will be)
// subscribed after us, so the channel must stay subscribed.
func (h *hub) unsubscribe(channel string) {
	defer h.wg.Done()
	h.opMu.Lock()
	defer h.opMu.Unlock()
	h.mu.Lock()
	renewed := h.subs[channel] != nil
	ps, closed := h.ps, h.closed
	h.mu.Unlock()
	if renewed || closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	_ = ps.Unsubscribe(ctx, channel)
}

func (h *hub) loop(msgs <-chan any, done chan struct{}) {
	defer close(done)
	for msg := range msgs {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			h.mu.Lock()
			if cs := h.subs[m.Channel]; cs != nil {
				if !cs.isReady {
					cs.isReady = true
					close(cs.ready)
				} else {
					// A resubscription after a reconnect: a release may
					// have been missed, so let the waiters look again.
					signal(cs)
				}
			}
			h.mu.Unlock()
		case *redis.Message:
			h.mu.Lock()
			if cs := h.subs[m.Channel]; cs != nil {
				signal(cs)
			}
			h.mu.Unlock()
		}
	}
}

func signal(cs *channelSubs) {
	for w := range cs.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (h *hub) close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	ps, done := h.ps, h.done
	for _, cs := range h.subs {
		if !cs.isReady {
			cs.err, cs.isReady = ErrClosed, true
			close(cs.ready)
		}
	}
	h.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	h.wg.Wait()
	return err
}
