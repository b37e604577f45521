package pglease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// pin is one session-mode grant: a pool connection taken out of use for the
// life of the lease, whose session holds the advisory lock. It is the
// grant's State.
type pin struct {
	b           *Backend
	pc          *pgxpool.Conn
	name, owner string
	token       fence.Token
	key         int64
	pid         uint32 // the server process holding the lock
	ttl         time.Duration
	idleWas     string // idle_session_timeout before the grant, restored on release

	sock net.Conn        // the socket under the connection, for deadlines; nil if unwatched
	raw  syscall.RawConn // nil if unwatched
	done chan struct{}   // closed when the socket watcher ends; nil if unwatched

	mu       sync.Mutex // held while the connection is in use; guards what follows
	notify   driver.Notifier
	lastSent time.Time // send time of the last request that found the lock held
	ended    error     // why the connection was given back or closed; nil while live
	stopping bool      // the socket watcher must end
	// settled: this Backend sent the grant's Release or Abandon, so the
	// owner is (or, after a failed request, is being) recorded as ended; a
	// later Release returns nil, not ErrNotHeld.
	settled bool
	// rowFree: the token row no longer holds this grant's expiry (marked
	// free by a Release or Abandon that the store answered).
	rowFree bool
}

func millis(ttl time.Duration) (int64, error) {
	if ttl < time.Millisecond || ttl%time.Millisecond != 0 || ttl > maxSessionTTL {
		return 0, fmt.Errorf("pglease: session TTL %v is not a whole number of milliseconds between 1 ms and %v", ttl, maxSessionTTL)
	}
	return ttl.Milliseconds(), nil
}

func (b *Backend) sessionAcquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	ms, err := millis(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	// The same owner again (a retried request whose reply was lost, or a
	// Manager asking twice): confirm the grant it has.
	b.mu.Lock()
	p := b.byName[req.Name]
	b.mu.Unlock()
	if p != nil && p.owner == req.Owner {
		if err := p.confirm(ctx); err != nil {
			if errors.Is(err, driver.ErrNotHeld) {
				return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name}
			}
			return driver.Grant{}, err
		}
		p.mu.Lock()
		if req.Notify != nil {
			p.notify = req.Notify
		}
		p.mu.Unlock()
		return p.grant(), nil
	}

	pc, err := b.db.Acquire(ctx)
	if err != nil {
		return driver.Grant{}, b.storeErr("acquire", req.Name, err)
	}
	key := lockKey(b.o.Schema, req.Name)
	var (
		ok, clean, ended bool
		token, leftUs    int64
		pid              int32
		idleWas          string
		hint             int64
	)
	announced := pc.Conn().PgConn().PID()
	sent := time.Now()
	var ahead, firstUs int64
	if req.Queue {
		err = pc.QueryRow(ctx, b.q.SessionAcquireQueued, req.Name, req.Owner, key, strconv.FormatInt(ms, 10), b.o.AllowPooler, int32(announced), req.TTL.Microseconds()).
			Scan(&ok, &token, &pid, &idleWas, &clean, &leftUs, &ended, &ahead, &firstUs, nil)
	} else {
		err = pc.QueryRow(ctx, b.q.SessionAcquire, req.Name, req.Owner, key, strconv.FormatInt(ms, 10), b.o.AllowPooler, int32(announced), req.TTL.Microseconds()).
			Scan(&ok, &token, &pid, &idleWas, &clean, &hint)
	}
	if err != nil {
		// The lock may be held (session locks survive a failed
		// statement): end the session.
		destroy(pc)
		return driver.Grant{}, b.storeErr("acquire", req.Name, err)
	}
	if uint32(pid) != announced && !b.o.AllowPooler {
		pc.Release() // the statement took nothing
		return driver.Grant{}, fmt.Errorf("%w: the connection announced server process %d at connect, but server process %d ran the statement (see Options.AllowPooler)",
			ErrPooler, announced, pid)
	}
	if !ok {
		if !clean {
			// It took the lock and could not give it back: end the
			// session, which frees it.
			destroy(pc)
		} else {
			pc.Release() // nothing was kept or set on it
		}
		if req.Queue {
			return driver.Grant{}, queuedRefusal(req, ended, leftUs, ahead, firstUs)
		}
		// Another session holds the lock, or the last holder's expiry
		// has not passed (its session may have ended on the server while
		// its holder, unaware, still counts the lease valid), or the
		// owner was ended.
		return driver.Grant{}, refusal(req, hint)
	}
	if token <= 0 {
		destroy(pc)
		return driver.Grant{}, fmt.Errorf("pglease: acquire %q: the store returned an invalid token %d", req.Name, token)
	}
	p = &pin{
		b: b, pc: pc, name: req.Name, owner: req.Owner, token: fence.Token(token), key: key,
		pid: uint32(pid), ttl: req.TTL, idleWas: idleWas, notify: req.Notify, lastSent: sent,
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		destroy(pc)
		return driver.Grant{}, ErrClosed
	}
	b.pins[p] = struct{}{}
	b.byName[p.name] = p
	b.mu.Unlock()
	if sock, raw := socketOf(pc.Conn().PgConn().Conn()); raw != nil {
		p.sock, p.raw, p.done = sock, raw, make(chan struct{})
		go p.watch()
	}
	return p.grant(), nil
}

func (p *pin) grant() driver.Grant {
	return driver.Grant{Name: p.name, Owner: p.owner, Token: p.token, TTL: p.ttl, State: p}
}

// pinOf returns the pin of g if g carries one with the same name, owner
// and token as the pin was granted with; else nil. The pin knows its own
// connection, so any Backend may renew or release it.
func (b *Backend) pinOf(g driver.Grant) *pin {
	p, ok := g.State.(*pin)
	if !ok || p == nil || p.name != g.Name || p.owner != g.Owner || p.token != g.Token {
		return nil
	}
	return p
}

func (b *Backend) sessionRenew(ctx context.Context, g driver.Grant) error {
	p := b.pinOf(g)
	if p == nil {
		return driver.ErrNotHeld
	}
	return p.confirm(ctx)
}

// confirm checks on the pinned connection that the lock is still held by
// the same server process and the token row still names the grant. A
// connection that broke, or a lock that is gone, ends the pin: ErrNotHeld.
func (p *pin) confirm(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended != nil {
		return fmt.Errorf("%w: %w", driver.ErrNotHeld, p.ended)
	}
	// Only ctx's deadline bounds the check, not its cancellation: pgx
	// closes a connection whose reply it stopped waiting for, which would
	// end the session (and the lease) because a caller lost interest.
	ctx, cancel := deadlineOnly(ctx)
	defer cancel()
	sent := time.Now()
	held, err := p.checkLocked(ctx)
	switch {
	case err != nil && p.pc.Conn().IsClosed():
		cause := fmt.Errorf("pglease: the pinned connection of %q broke: %w", p.name, err)
		p.endLocked(cause)
		return fmt.Errorf("%w: %w", driver.ErrNotHeld, cause)
	case err != nil:
		return p.b.storeErr("renew", p.name, err)
	case !held:
		cause := fmt.Errorf("pglease: the session of %q no longer holds its lock and token", p.name)
		p.endLocked(cause)
		return fmt.Errorf("%w: %w", driver.ErrNotHeld, cause)
	}
	p.lastSent = sent
	return nil
}

// checkLocked runs the renewal on the pinned connection: if the same
// server process still holds the lock and the token row still names the
// grant, it extends the row's expiry to the server's clock + TTL and
// reports true. p.mu must be held.
func (p *pin) checkLocked(ctx context.Context) (bool, error) {
	var held bool
	err := p.pc.QueryRow(ctx, p.b.q.SessionRenew, p.name, p.owner, int64(p.token), int32(p.pid),
		int64(uint64(p.key)>>32), int64(uint64(p.key)&0xffffffff), p.ttl.Microseconds()).Scan(&held)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return held, err
}

func (b *Backend) sessionRelease(ctx context.Context, g driver.Grant) error {
	p := b.pinOf(g)
	if p == nil {
		return driver.ErrNotHeld
	}
	ctx, cancel := deadlineOnly(ctx)
	defer cancel()
	p.mu.Lock()
	if p.ended != nil {
		settled, rowFree, cause := p.settled, p.rowFree, p.ended
		p.settled = true
		p.mu.Unlock()
		if !settled {
			// Lost (the session ended, the grant expired): the Manager
			// ended the lease before it sent this Release, so the row
			// can be marked free and the owner recorded as ended.
			if !rowFree {
				_ = p.freeRow(ctx) // else the row expires after its TTL
			}
			return fmt.Errorf("%w: %w", driver.ErrNotHeld, cause)
		}
		// Released or abandoned by this Backend before: a retried
		// release. If the earlier request was cut short, finish it.
		if !rowFree {
			if err := p.freeRow(ctx); err != nil {
				return b.storeErr("release", p.name, err)
			}
		}
		return nil
	}
	p.settled = true
	var named, unlocked bool
	err := p.pc.QueryRow(ctx, p.b.q.SessionRelease, p.name, p.owner, int64(p.token), int32(p.pid), p.key, p.idleWas, Channel, endedMicros(p.ttl)).
		Scan(&named, &unlocked, nil, nil, nil)
	switch {
	case err != nil:
		// The lock's state is unknown: end the session (the server frees
		// the lock). The release may have been applied; if the row can
		// be marked free now, it is a release.
		p.endLocked(fmt.Errorf("pglease: release of %q failed: %w", p.name, err))
		p.mu.Unlock()
		if ferr := p.freeRow(ctx); ferr == nil {
			return nil
		}
		return b.storeErr("release", p.name, err)
	case !unlocked:
		p.rowFree = named
		p.endLocked(errors.New("pglease: the session did not hold the lock at release"))
		p.mu.Unlock()
		return driver.ErrNotHeld
	}
	// Unlocked, with the session's setting restored: the connection is
	// clean and goes back to the pool once the socket watcher is gone.
	p.ended = errReleased
	p.rowFree = true
	p.unregister()
	p.stopping = true
	if p.sock != nil {
		_ = p.sock.SetReadDeadline(time.Now())
	}
	p.mu.Unlock()
	if p.done != nil {
		<-p.done
		_ = p.sock.SetReadDeadline(time.Time{})
	}
	p.pc.Release()
	if !named {
		return driver.ErrNotHeld // the lock was ours, but the token row had moved on (data loss)
	}
	return nil
}

// freeRow marks the token row free if it still names the pin's grant and
// records the owner as ended, in one statement on a connection of the pool
// (the pinned one is gone). Call it only once the lease is no longer
// valid for its holder (it was released, or its loss reported): it ends
// the wait that a new holder would otherwise have for the row's expiry.
func (p *pin) freeRow(ctx context.Context) error {
	b := p.b
	var ended bool
	err := b.db.QueryRow(ctx, b.q.SessionAbandon, p.name, p.owner, endedMicros(p.ttl), Channel,
		int64(uint64(p.key)>>32), int64(uint64(p.key)&0xffffffff), false).Scan(&ended)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.rowFree = true
	p.mu.Unlock()
	return nil
}

// freeRowBounded is freeRow bounded by one second, for goroutines that
// have no context (the socket watcher, Close).
func (p *pin) freeRowBounded() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.freeRow(ctx) // the row then expires after its TTL
}

func (b *Backend) sessionAbandon(ctx context.Context, req driver.Request) error {
	// A grant this Backend made to the owner: end its session here.
	b.mu.Lock()
	p := b.byName[req.Name]
	b.mu.Unlock()
	if p != nil && p.owner == req.Owner {
		p.mu.Lock()
		p.settled = true
		p.endLocked(errAbandoned)
		p.mu.Unlock()
	}
	key := lockKey(b.o.Schema, req.Name)
	var ended bool
	err := b.db.QueryRow(ctx, b.q.SessionAbandon, req.Name, req.Owner, endedMicros(req.TTL), Channel,
		int64(uint64(key)>>32), int64(uint64(key)&0xffffffff), req.Queue).Scan(&ended)
	if err != nil {
		return b.storeErr("abandon", req.Name, err)
	}
	if p != nil && p.owner == req.Owner {
		p.mu.Lock()
		p.rowFree = true
		p.mu.Unlock()
	}
	return nil
}

// errAbandoned is the cause recorded on a session grant ended by Abandon.
var errAbandoned = errors.New("pglease: abandoned")

// errReleased is the cause recorded on a session grant released at the
// store; a later Renew or Release of it matches driver.ErrNotHeld.
var errReleased = errors.New("pglease: released")

// endLocked closes the pinned connection (the server then frees its lock)
// and records why; p.mu must be held. The socket watcher sees the closed
// socket and ends.
func (p *pin) endLocked(cause error) {
	if p.ended != nil {
		return
	}
	p.ended = cause
	p.unregister()
	destroy(p.pc)
}

func (p *pin) unregister() {
	b := p.b
	b.mu.Lock()
	delete(b.pins, p)
	if b.byName[p.name] == p {
		delete(b.byName, p.name)
	}
	b.mu.Unlock()
}

// abandon ends the pin from outside (Close) and reports the loss; once
// the holder knows, it marks the token row free.
func (p *pin) abandon(cause error) {
	p.mu.Lock()
	live := p.ended == nil
	p.endLocked(cause)
	notify := p.notify
	p.mu.Unlock()
	if p.done != nil {
		<-p.done
	}
	if live && notify != nil {
		notify.Lost(cause)
		p.freeRowBounded()
	}
}

// watch waits on the pinned connection's socket while it is idle. Bytes or
// EOF on an idle connection mean the server said something unasked (most
// often: FATAL, the session was terminated) or the socket broke; the
// watcher then checks the lock at once and reports a loss through the
// lease's Notifier. A reply to a request the backend itself sent also wakes
// it; it then waits for that request to finish and finds nothing left to
// read.
func (p *pin) watch() {
	defer close(p.done)
	for {
		werr := waitReadable(p.raw)
		p.mu.Lock()
		if p.stopping || p.ended != nil {
			p.mu.Unlock()
			return
		}
		var nerr net.Error
		if (werr == nil && !readableNow(p.raw)) || (errors.As(werr, &nerr) && nerr.Timeout()) {
			// A reply that the request holding the connection has read,
			// or a deadline the driver set for that request and has
			// cleared since.
			p.mu.Unlock()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.ttl)
		sent := time.Now()
		held, err := p.checkLocked(ctx)
		cancel()
		if err == nil && held {
			p.lastSent = sent
			notify := p.notify
			p.mu.Unlock()
			if notify != nil {
				notify.Confirmed(sent)
			}
			continue
		}
		cause := err
		if cause == nil {
			cause = errors.New("the session no longer holds its lock and token")
		}
		cause = fmt.Errorf("pglease: the session of %q ended: %w", p.name, cause)
		// Push the loss only before the grant's TTL has run out since it
		// was last confirmed: after that, the Manager's own deadline has
		// already passed, and the server ending an idle session at its
		// TTL is an expiry, not a takeover.
		early := time.Since(p.lastSent) < p.ttl
		notify := p.notify
		p.ended = cause
		p.unregister()
		p.mu.Unlock()
		destroy(p.pc)
		if early && notify != nil {
			notify.Lost(cause)
		}
		if !early || notify != nil {
			// The holder's lease has ended (Lost returns once it has,
			// or its deadline had passed): the next holder need not
			// wait out the row's expiry.
			p.freeRowBounded()
		}
		return
	}
}

// deadlineOnly returns a context with ctx's values and deadline but not its
// cancellation.
func deadlineOnly(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

// destroy closes a pool connection and hands it back, so that the pool
// drops it; the server ends its session and frees its locks.
func destroy(pc *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = pc.Conn().Close(ctx)
	pc.Release()
}
