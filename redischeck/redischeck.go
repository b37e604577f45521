// Package redischeck is a fencecheck.Checker on Redis: for a service that
// receives fencing tokens from its callers (package fencehttp, fencegrpc)
// and runs on several replicas that must share one order of tokens per
// resource. Each resource's newest token is one string key, advanced by a
// Lua script ("accept if not older, and remember") that Redis runs
// atomically; tokens are compared as decimal strings, so every uint64
// token compares exactly.
//
// It takes the narrowest go-redis interface, redis.Scripter, so a
// *redis.Client, a *redis.ClusterClient (one key per script: any slot
// works), a *redis.Ring or a wrapper of your own fits.
//
// # What it guarantees, and on what
//
// The script orders the checks of every replica that uses the same Redis.
// It does not order the handler's effects after a check (see package
// fencecheck: a check orders checks, not effects). It is only as durable
// as the key: a Redis that loses the key (a restart without persistence,
// FLUSHALL, eviction under maxmemory with a volatile policy does not touch
// it since it has no TTL, but allkeys-* policies may, a failover to a
// replica that had not received the write) forgets the newest token, and
// until the newest holder checks again an older one is accepted. Run it on
// a Redis with appendonly yes and appendfsync always and a noeviction or
// volatile-* policy, or use sqlguard.Checker, whose tokens are in
// PostgreSQL's write-ahead log.
package redischeck

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
)

//go:embed check.lua
var checkLua string

var (
	checkScript   = redis.NewScript(checkLua)
	currentScript = redis.NewScript(`return redis.call('GET', KEYS[1])`)
)

// DefaultKeyPrefix is the prefix of the resource keys unless
// Options.KeyPrefix says otherwise.
const DefaultKeyPrefix = "fencekit:check:"

// MaxResourceLen is the longest resource name, in bytes.
const MaxResourceLen = fencecheck.MaxResourceLen

// ErrInvalid is matched by the error New returns for unusable options.
var ErrInvalid = errors.New("redischeck: invalid argument")

// ErrCorrupt is matched by the error Check returns when a resource's key
// holds something that is not a token (written by something else); the
// check is refused, nothing changed.
var ErrCorrupt = errors.New("redischeck: the resource's key does not hold a token")

// Options configure a Checker.
type Options struct {
	// KeyPrefix is prepended to every resource name to make its key.
	// Default DefaultKeyPrefix. The key is the prefix and the name as
	// they are: give each Checker that must keep its own order a prefix
	// of its own.
	KeyPrefix string
}

// Option changes Options.
type Option func(*Options)

// WithKeyPrefix sets Options.KeyPrefix.
func WithKeyPrefix(p string) Option { return func(o *Options) { o.KeyPrefix = p } }

// Checker is a fencecheck.Checker on Redis. It is safe for concurrent use.
type Checker struct {
	c      redis.Scripter
	prefix string
}

var _ fencecheck.Checker = (*Checker)(nil)

// New returns a Checker that runs its scripts on c. It does no I/O. It
// returns an error matching ErrInvalid for a nil client or an empty
// KeyPrefix set through WithKeyPrefix("").
func New(c redis.Scripter, opts ...Option) (*Checker, error) {
	o := Options{KeyPrefix: DefaultKeyPrefix}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var errs []error
	if c == nil {
		errs = append(errs, fmt.Errorf("%w: nil client", ErrInvalid))
	}
	if o.KeyPrefix == "" {
		errs = append(errs, fmt.Errorf("%w: empty key prefix (keys would collide with any other use of the database)", ErrInvalid))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Checker{c: c, prefix: o.KeyPrefix}, nil
}

// Key returns the key that holds resource's newest token.
func (c *Checker) Key(resource string) string { return c.prefix + resource }

// Check implements fencecheck.Checker with one script (EVALSHA, or EVAL
// the first time on a server): one round trip. It returns nil when the
// token was accepted; a *fence.StaleError naming the stored token when
// that is newer (nothing changed); before any I/O, an error matching
// fence.ErrInvalidToken for token 0, and one matching
// fencecheck.ErrInvalidResource for an empty name, one longer than
// MaxResourceLen bytes or not UTF-8; ErrCorrupt when the key holds
// something else; an error matching fence.ErrOutcomeUnknown when the
// script may have run and its answer was lost (a timeout, ctx ended, the
// connection broke: the token may have been stored); other errors wrapped.
// ctx bounds the call (with the client's ContextTimeoutEnabled, as
// go-redis requires).
func (c *Checker) Check(ctx context.Context, resource string, token fence.Token) error {
	op := "check " + strconv.Quote(resource)
	if err := errors.Join(token.Validate(), fencecheck.ValidateResource(resource, MaxResourceLen)); err != nil {
		return fmt.Errorf("redischeck: %s: %w", op, err)
	}
	res, err := checkScript.Run(ctx, c.c, []string{c.Key(resource)}, token.String()).Slice()
	if err != nil {
		return scriptErr(op, err)
	}
	if len(res) != 2 {
		return fmt.Errorf("redischeck: %s: unexpected reply %v", op, res)
	}
	accepted, _ := res[0].(int64)
	stored, _ := res[1].(string)
	cur, perr := strconv.ParseUint(stored, 10, 64)
	switch {
	case perr != nil:
		return fmt.Errorf("redischeck: %s: unexpected token %q in the reply: %v", op, stored, perr)
	case accepted == 1:
		return nil
	}
	return fence.Stale(resource, token, fence.Token(cur))
}

// Current returns the newest token stored for resource, or fence.None. It
// returns ErrCorrupt when the key holds something else, an error matching
// fencecheck.ErrInvalidResource before any I/O for a bad name, other errors
// wrapped. ctx bounds the call.
func (c *Checker) Current(ctx context.Context, resource string) (fence.Token, error) {
	op := "current token of " + strconv.Quote(resource)
	if err := fencecheck.ValidateResource(resource, MaxResourceLen); err != nil {
		return fence.None, fmt.Errorf("redischeck: %s: %w", op, err)
	}
	s, err := currentScript.RunRO(ctx, c.c, []string{c.Key(resource)}).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return fence.None, nil
	case err != nil:
		return fence.None, fmt.Errorf("redischeck: %s: %w", op, err)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != s {
		return fence.None, fmt.Errorf("redischeck: %s: %w: %.40q", op, ErrCorrupt, s)
	}
	return fence.Token(n), nil
}

// scriptErr classifies a failed script call: an error reply from the
// server is plain (the script did not run, or failed before SET: nothing
// changed); a failure to connect is plain (nothing was sent); anything
// else (a timeout, a context that ended, a broken connection) may have
// come after the script ran, and is an unknown outcome.
func scriptErr(op string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if strings.Contains(rerr.Error(), "FENCEKIT_CORRUPT") {
			return fmt.Errorf("redischeck: %s: %w: %w", op, ErrCorrupt, err)
		}
		return fmt.Errorf("redischeck: %s: %w", op, err)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return fmt.Errorf("redischeck: %s: %w", op, err)
	}
	return fmt.Errorf("redischeck: %s: %w: %w", op, fence.ErrOutcomeUnknown, err)
}
