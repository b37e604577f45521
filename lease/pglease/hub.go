package pglease

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// hub delivers release notifications to any number of waiters over one
// listening connection, taken from the pool on first use and kept out of it
// (hijacked). One goroutine owns that connection: it connects, sends LISTEN,
// waits for notifications and dispatches them by payload (the lease name),
// and reconnects with backoff when the connection breaks. While it is down,
// Watch fails fast and the Manager polls.
type hub struct {
	db  Pool
	log *slog.Logger

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	state   hubState
	settled chan struct{} // closed when a connect attempt ends (up or down)
	lastErr error         // why the hub is down
	cancel  context.CancelFunc
	done    chan struct{} // closed when the loop ends
	closed  bool
}

type hubState uint8

const (
	hubIdle       hubState = iota // no loop yet
	hubConnecting                 // a connect attempt is in progress
	hubUp                         // LISTEN is active
	hubDown                       // the last attempt failed or the connection broke; retrying after a backoff
)

// Backoff of the listener's reconnection attempts.
const (
	hubMinBackoff = 50 * time.Millisecond
	hubMaxBackoff = 5 * time.Second
	// hubConnectTimeout bounds one connect-and-LISTEN attempt.
	hubConnectTimeout = 10 * time.Second
)

func newHub(db Pool, log *slog.Logger) *hub {
	return &hub{db: db, log: log, waiters: make(map[string]map[chan struct{}]struct{})}
}

func (h *hub) watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	w := make(chan struct{}, 1)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, ErrClosed
	}
	if h.state == hubIdle {
		lctx, cancel := context.WithCancel(context.Background())
		h.cancel, h.done = cancel, make(chan struct{})
		h.state, h.settled = hubConnecting, make(chan struct{})
		go h.loop(lctx)
	}
	ws := h.waiters[name]
	if ws == nil {
		ws = make(map[chan struct{}]struct{})
		h.waiters[name] = ws
	}
	ws[w] = struct{}{}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			h.mu.Lock()
			delete(ws, w)
			if len(h.waiters[name]) == 0 {
				delete(h.waiters, name)
			}
			h.mu.Unlock()
		})
	}
	for {
		switch h.state {
		case hubUp:
			h.mu.Unlock()
			return w, stop, nil
		case hubDown:
			err := h.lastErr
			h.mu.Unlock()
			stop()
			return nil, nil, fmt.Errorf("pglease: release notifications unavailable: %w", err)
		}
		settled := h.settled
		h.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			stop()
			return nil, nil, ctx.Err()
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			stop()
			return nil, nil, ErrClosed
		}
	}
}

// settle records the outcome of a connect attempt (err nil: up) and wakes
// the Watch calls waiting for it.
func (h *hub) settle(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.state, h.lastErr = hubUp, nil
	} else {
		h.state, h.lastErr = hubDown, err
	}
	close(h.settled)
	h.settled = make(chan struct{})
}

func (h *hub) loop(ctx context.Context) {
	defer close(h.done)
	backoff := hubMinBackoff
	for {
		conn, err := h.connect(ctx)
		if ctx.Err() != nil {
			if conn != nil {
				closeConn(conn)
			}
			h.settle(ErrClosed)
			return
		}
		if err != nil {
			h.settle(err)
			h.log.Warn("pglease: cannot listen for releases; waiters poll", "err", err, "retry_in", backoff)
		} else {
			h.settle(nil)
			h.signalAll() // a release may have been missed while down
			backoff = hubMinBackoff
			err = h.listen(ctx, conn)
			closeConn(conn)
			if ctx.Err() != nil {
				h.settle(ErrClosed)
				return
			}
			h.mu.Lock()
			h.state, h.lastErr = hubDown, err
			h.mu.Unlock()
			h.signalAll() // waiters look again, and poll while we reconnect
			h.log.Warn("pglease: listening connection lost; reconnecting", "err", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			h.settle(ErrClosed)
			return
		case <-t.C:
		}
		backoff = min(2*backoff, hubMaxBackoff)
		h.mu.Lock()
		h.state = hubConnecting
		h.mu.Unlock()
	}
}

// connect takes a connection out of the pool for good and sends LISTEN.
func (h *hub) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, hubConnectTimeout)
	defer cancel()
	pc, err := h.db.Acquire(cctx)
	if err != nil {
		return nil, fmt.Errorf("listen: acquire a connection: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{Channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("listen: %w", err)
	}
	return conn, nil
}

// listen dispatches notifications until the connection breaks or ctx ends.
func (h *hub) listen(ctx context.Context, conn *pgx.Conn) error {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		h.mu.Lock()
		for w := range h.waiters[n.Payload] {
			signal(w)
		}
		h.mu.Unlock()
	}
}

func (h *hub) signalAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ws := range h.waiters {
		for w := range ws {
			signal(w)
		}
	}
}

func signal(w chan struct{}) {
	select {
	case w <- struct{}{}:
	default:
	}
}

func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	cancel, done := h.cancel, h.done
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// closeConn closes a connection the backend owns, bounded so that a dead
// server cannot hold it up.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx) // the connection is gone either way
}
