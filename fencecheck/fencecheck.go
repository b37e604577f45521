// Package fencecheck is the check a service makes at its own boundary when
// its writes have no conditional store behind them: per resource, the
// newest fencing token it has accepted, advanced atomically ("accept the
// token if it is not older than the newest, and remember it"). Chubby
// offered this as CheckSequencer (Burrows 2006); Kleppmann (2016) asks for
// it wherever a fenced write leaves the store that could check it.
//
// Checker is the contract; Memory keeps the tokens in the process (for one
// process, tests and examples). sqlguard.Checker keeps them in PostgreSQL
// and redischeck.Checker in Redis, so that several replicas of a service
// share one order. fencehttp and fencegrpc call a Checker before the
// handler runs.
//
// # What a check orders, and what it does not
//
// A check orders checks, not effects. When a handler checks token 5, then
// does something the checker does not see (sends a mail, calls a payment
// gateway, writes a store of its own), a holder with token 6 can check and
// act in between, and token 5's effect can land after token 6's: the check
// said only that no newer token had been checked when 5 was. That is enough
// when the handler's effect is quick compared with how long a newer holder
// takes to appear (a lease TTL), and is a race otherwise. To order effects,
// record the token in the same atomic step as the service's own state:
// in PostgreSQL, call sqlguard.Checker.CheckTx (sqlguard.Guard.Advance) in
// the transaction that writes the state (the token row stays locked until it commits, so a newer
// holder waits); in one process, Memory.Do runs the effect while the
// resource's token is held. An effect outside the service's own store
// cannot be ordered by the service at all: pass the token on to that
// store (fencehttp.Transport), or make the effect idempotent.
package fencecheck

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/names"
)

// Checker keeps, per resource, the newest fencing token it has accepted.
// Implementations are safe for concurrent use.
type Checker interface {
	// Check accepts token for resource if it is not older than the newest
	// token accepted for resource (or none was), and remembers it as the
	// newest, in one atomic step. It returns nil when the token was
	// accepted (an equal token is accepted: the same holder again); a
	// *fence.StaleError (matching fence.ErrStaleToken) naming the newest
	// token when that is newer, after which nothing changed; an error
	// matching fence.ErrInvalidToken or ErrInvalidResource before any I/O
	// for token 0 or a bad resource name; an error matching ErrTokenRange
	// (and not fence.ErrInvalidToken) before any I/O for a valid token
	// above the largest the checker can store, which it documents (a
	// receiver answers it with fencewire.ProblemTokenRange, never as a
	// malformed field); an error matching
	// fence.ErrOutcomeUnknown when the check was sent to the store and its
	// answer was lost (the token may have been recorded); other errors
	// wrapped. ctx bounds the call.
	Check(ctx context.Context, resource string, token fence.Token) error
}

// MaxResourceLen is the longest resource name Memory accepts, in bytes.
// (sqlguard.Checker's limit is its MaxResourceLen, 1024; fencewire carries
// names up to 512 bytes.)
const MaxResourceLen = 1024

// ErrInvalidResource is matched by the error a Checker returns, before any
// I/O, for a resource name it cannot use: empty, not valid UTF-8, or longer
// than its limit.
var ErrInvalidResource = errors.New("fencecheck: invalid resource name")

// ErrTokenRange is matched by the error a Checker returns, before any I/O,
// for a valid token it cannot store: one above the largest token its store
// holds (sqlguard.Checker keeps tokens in a PostgreSQL bigint, so tokens
// from 2^63 to 2^64-1 are out of its range; Memory and redischeck.Checker
// store every token). Nothing changed. It is not a malformed token (the
// wire format carries every token from 1 to 2^64-1) and not a stale one:
// a receiver answers it with fencewire.ProblemTokenRange.
var ErrTokenRange = errors.New("fencecheck: the token is beyond what the checker can store")

// ValidateResource returns an error matching ErrInvalidResource when name
// is empty, longer than max bytes, not valid UTF-8, or holds a NUL byte.
func ValidateResource(name string, max int) error {
	return names.Check(ErrInvalidResource, "resource name", name, names.Rules{Max: max})
}

// Memory is a Checker that keeps the tokens in this process's memory. It
// orders the checks of one process; replicas of a service need a shared
// checker (sqlguard.Checker, redischeck.Checker). Its tokens are lost when
// the process ends: a restarted service accepts any token again until the
// newest holder writes. The zero value is not usable; call NewMemory.
type Memory struct {
	mu        sync.Mutex
	resources map[string]*entry
}

type entry struct {
	sem   chan struct{} // a lock that a wait can give up on: full while held
	token fence.Token
}

var _ Checker = (*Memory)(nil)

// NewMemory returns an empty Memory checker.
func NewMemory() *Memory { return &Memory{resources: make(map[string]*entry)} }

func (m *Memory) entry(resource string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.resources[resource]
	if e == nil {
		e = &entry{sem: make(chan struct{}, 1)}
		m.resources[resource] = e
	}
	return e
}

func validate(resource string, token fence.Token) error {
	return errors.Join(token.Validate(), ValidateResource(resource, MaxResourceLen))
}

// Check implements Checker. It waits for a Do of the same resource that is
// running its function, or until ctx ends (then it returns ctx's error and
// recorded nothing).
func (m *Memory) Check(ctx context.Context, resource string, token fence.Token) error {
	return m.Do(ctx, resource, token, nil)
}

// Do checks token for resource as Check does and, when it is accepted, runs
// fn while it holds the resource: no other Check or Do of the resource runs
// until fn returns, so fn's effects are ordered by token like the checks
// are. The token is remembered only if fn returns nil; fn's error is
// returned as it is. A nil fn makes Do a Check. ctx bounds the wait for the
// resource (not fn, which should take its own ctx).
func (m *Memory) Do(ctx context.Context, resource string, token fence.Token, fn func() error) error {
	if err := validate(resource, token); err != nil {
		return fmt.Errorf("fencecheck: check %q: %w", resource, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fencecheck: check %q: %w", resource, err)
	}
	e := m.entry(resource)
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("fencecheck: check %q: %w", resource, ctx.Err())
	}
	defer func() { <-e.sem }()
	if token < e.token {
		return fence.Stale(resource, token, e.token)
	}
	if fn != nil {
		if err := fn(); err != nil {
			return err
		}
	}
	e.token = token
	return nil
}

// Current returns the newest token accepted for resource, or fence.None.
func (m *Memory) Current(resource string) fence.Token {
	e := m.entry(resource)
	e.sem <- struct{}{}
	defer func() { <-e.sem }()
	return e.token
}
