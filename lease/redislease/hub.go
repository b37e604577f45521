package redislease

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// hub multiplexes release notifications for any number of waiters over one
// pub/sub connection, created on first use.
type hub struct {
	c Client

	mu     sync.Mutex
	ps     *redis.PubSub
	done   chan struct{} // closed when the receive loop ends
	subs   map[string]*channelSubs
	closed bool
}

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
		h.ps = h.c.Subscribe(ctx) // no channels yet: no I/O
		h.done = make(chan struct{})
		go h.loop(h.ps.ChannelWithSubscriptions(), h.done)
	}
	ps := h.ps
	cs := h.subs[channel]
	first := cs == nil
	if first {
		cs = &channelSubs{ready: make(chan struct{}), waiters: make(map[chan struct{}]struct{})}
		h.subs[channel] = cs
	}
	w := make(chan struct{}, 1)
	cs.waiters[w] = struct{}{}
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.detach(channel, cs, w) }) }

	if first {
		if err := ps.Subscribe(ctx, channel); err != nil {
			h.mu.Lock()
			if !cs.isReady {
				cs.err, cs.isReady = err, true
				close(cs.ready)
			}
			h.mu.Unlock()
		}
	}
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

// detach removes one waiter and unsubscribes when none is left.
func (h *hub) detach(channel string, cs *channelSubs, w chan struct{}) {
	h.mu.Lock()
	delete(cs.waiters, w)
	last := len(cs.waiters) == 0 && h.subs[channel] == cs
	if last {
		delete(h.subs, channel)
	}
	ps, closed := h.ps, h.closed
	h.mu.Unlock()
	if last && !closed && cs.err == nil {
		// A bounded cleanup with no caller context to inherit.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = ps.Unsubscribe(ctx, channel)
		cancel()
	}
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
	return err
}
