package redislease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lease/driver"
)

var (
	//go:embed check.lua
	checkSrc    string
	checkScript = redis.NewScript(checkSrc)
)

// setup returns err as an error matching driver.ErrSetup when it is one that
// retrying cannot fix, naming the fix, and err otherwise:
//
//   - NOAUTH, WRONGPASS (and a password sent to a server without one):
//     the credentials;
//   - NOPERM, or a command a script runs refused by the ACL: the
//     permissions fencekit needs;
//   - EVAL or EVALSHA unknown to the server: it does not run Lua scripts;
//   - a database number the server does not have.
//
// READONLY (a replica, as during a Sentinel failover), LOADING,
// CLUSTERDOWN, TRYAGAIN, OOM and errors without a reply (connection
// refused, timeouts) are transient: they are returned as they are.
func (b *Backend) setup(err error) error {
	if err == nil || errors.Is(err, driver.ErrSetup) {
		return err
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return err // no reply: the server may come back
	}
	msg := re.Error()
	switch {
	case redis.IsAuthError(err):
		return &driver.SetupError{Fix: "Redis refused the credentials: set the user and password in FENCE_REDIS_URL, redis://user:password@host:port, or Username and Password in the client's Options", Err: err}
	case strings.Contains(msg, "AUTH") && strings.Contains(msg, "without any password configured"):
		return &driver.SetupError{Fix: "the client sends a password but Redis has none configured: remove it from FENCE_REDIS_URL or the client's Options, or set requirepass", Err: err}
	case redis.IsPermissionError(err), strings.Contains(msg, "can't run this command or subcommand"):
		return &driver.SetupError{Fix: b.permissionsFix(""), Err: err}
	case unknownScripting(msg):
		return &driver.SetupError{Fix: "the server does not run Lua scripts, EVAL and EVALSHA, which fencekit needs: use Redis, or a compatible server with scripting enabled", Err: err}
	case strings.Contains(msg, "DB index is out of range"):
		return &driver.SetupError{Fix: "Redis has no such database: fix the database number in FENCE_REDIS_URL, redis://host:port/<db>, or DB in the client's Options", Err: err}
	}
	return err
}

// permissionsFix names what the Redis user needs; denied, if not empty,
// lists what the ACL refuses.
func (b *Backend) permissionsFix(denied string) string {
	chans := "SPUBLISH and SSUBSCRIBE, or PUBLISH and SUBSCRIBE with WithClassicPubSub,"
	if b.notice == "classic" {
		chans = "PUBLISH and SUBSCRIBE"
	}
	s := fmt.Sprintf("the Redis user lacks permissions fencekit needs: grant EVALSHA, EVAL, SCRIPT LOAD and what its scripts run, GET SET DEL EXISTS PEXPIRE PTTL TIME, on keys ~%s*, and %s on channels &%s*", b.prefix, chans, b.prefix)
	if denied != "" {
		s += "; refused now: " + denied
	}
	return s
}

// unknownScripting reports whether msg is a server's refusal of EVAL or
// EVALSHA as an unknown command.
func unknownScripting(msg string) bool {
	m := strings.ToLower(msg)
	i := strings.Index(m, "unknown command")
	if i < 0 {
		return false
	}
	m = m[i:]
	if j := strings.Index(m, ", with args"); j >= 0 {
		m = m[:j]
	}
	return strings.Contains(m, "eval")
}

// checkName is the lease name whose keys Check names in its permission
// probe; nothing reads or writes them.
const checkName = "fencekit-check"

// Check implements driver.Checker. In order, it sends PING (when the client
// has Ping), loads fencekit's scripts (SCRIPT LOAD: idempotent; on a
// Cluster client, on every master; a user without SCRIPT LOAD is not
// refused for it, as EVALSHA falls back to EVAL), and runs a check script
// (EVALSHA, or EVAL) that asks the ACL (redis.acl_check_cmd, Redis 7.0+),
// without running them, whether the user may run what fencekit's scripts
// and waiters run on the prefix's keys and channels. It writes, publishes
// and subscribes nothing.
//
// An error matching driver.ErrSetup names the fix: refused credentials,
// missing permissions (listing those refused), a server that does not run
// scripts. A server that cannot be reached, or answers READONLY or
// LOADING, gives its own error.
func (b *Backend) Check(ctx context.Context) error {
	c := b.c
	if rc, ok := c.(*reloadingClient); ok {
		c = rc.Client // a Cluster client, wrapped: it has Ping
	}
	if p, ok := c.(interface {
		Ping(context.Context) *redis.StatusCmd
	}); ok {
		if err := p.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redislease: check: %w", b.setup(err))
		}
	}
	for _, s := range []*redis.Script{acquireScript, renewScript, b.release, b.abandon, holderScript} {
		err := s.Load(ctx, b.c).Err()
		if err == nil {
			continue
		}
		var re redis.Error
		if redis.IsPermissionError(err) || (errors.As(err, &re) && strings.Contains(strings.ToLower(re.Error()), "unknown command")) {
			break // EVALSHA falls back to EVAL: loading is not required
		}
		return fmt.Errorf("redislease: check: loading the scripts: %w", b.setup(err))
	}
	lk, tk, ek := b.keys(checkName, "lease", "token", endedSuffix+"check")
	_, _, ch := b.keys(checkName, "lease", "token", "released")
	denied, err := checkScript.Run(ctx, b.c, []string{lk, tk, ek}, ch, b.notice).Text()
	if err != nil {
		return fmt.Errorf("redislease: check: %w", b.setup(err))
	}
	if denied != "" {
		return fmt.Errorf("redislease: check: %w", &driver.SetupError{Fix: b.permissionsFix(denied)})
	}
	return nil
}
