// Package redislease is the Redis backend of package lease, over go-redis v9
// (a standalone client, Sentinel failover client or Cluster client).
//
// Each operation is one Lua script, one round trip:
//
//   - Acquire: refuse an owner that has a tombstone (below); mint the
//     token, then SET the lease key to "<token>:<owner>" with NX and a TTL
//     in milliseconds; if the same owner holds it (a retried request),
//     extend it and return its token; otherwise return the holder's
//     remaining time (PTTL). The token is computed on every attempt but
//     stored in the counter only with a grant.
//   - Renew: extend the TTL only if the stored owner and token are the
//     grant's (compare-then-extend).
//   - Release: delete only if the stored owner and token are the grant's
//     (compare-then-delete), publish on the lease's release channel so
//     that blocked waiters wake at once, and leave the owner's tombstone.
//     The notice goes out with SPUBLISH (sharded pub/sub, Redis 7.0+), or
//     PUBLISH on a server without it or with Options.ClassicPubSub.
//     Waiters share one pub/sub connection per Backend (one per hash
//     slot's node on a Cluster).
//   - Abandon: leave the owner's tombstone, and delete the lease if that
//     owner holds it (any token), publishing as Release does.
//   - Revoke (driver.Revoker, an operator's fencekit lease revoke): delete
//     the lease if it still holds the named owner and token, publishing as
//     Release does, and leave the owner's tombstone saying "lost" (its
//     Release then answers driver.ErrNotHeld). List (driver.Lister) scans
//     the keyspace (every master of a Cluster) for the names under a
//     prefix; Status reads a name's grant and live waiters in one script.
//   - Waiters in line (driver.Request.Queue, lease.Options.FIFO): the same
//     acquire script with two more keys, "<prefix>{<name>}:line" (owners
//     scored by arrival) and "<prefix>{<name>}:places" (the same owners
//     scored by when their places lapse, server time in ms). It drops
//     lapsed places, grants a free name only to the first live waiter,
//     and otherwise puts the owner at the end of the line or refreshes its
//     place for the TTL; the keys live as long as their longest place.
//     Abandon also removes the place, publishing when that leaves a free
//     name to the next waiter. A release then wakes this Backend's
//     waiters of the name one at a time, in the order they began to watch,
//     each one refused for a waiter ahead passing the wake on.
//
// TTLs are whole milliseconds, at least MinTTL (Backend.Limits).
//
// The keys of one lease name share a Redis Cluster hash slot: they are
// "<prefix>{<name>}:lease", "<prefix>{<name>}:token", the channel
// "<prefix>{<name>}:released" and the tombstones
// "<prefix>{<name>}:ended:<owner>", with '%', '{' and '}' in the name
// percent-encoded so that any name keeps its braces balanced (the owner
// follows the hash tag, so it may hold anything).
//
// # Ended owners: tombstones, what they cost and how long they last
//
// Release and Abandon end an owner at Redis: each writes the key
// "<prefix>{<name>}:ended:<owner>" (the value says "released", "lost" or
// "abandoned") with PX driver.EndedOwnerTTL(TTL), that is max(2 TTL, 10 s),
// in the same script as the delete. While it lives:
//
//   - Acquire refuses the owner (an error matching driver.ErrNotAcquired),
//     so an acquire request that reaches Redis after its sender gave it up
//     (a blocking Acquire abandons an attempt held past the lease's
//     validity and goes on as a new owner) grants nothing, instead of
//     leaving a grant nobody holds, with a higher token, for a TTL.
//   - A Release that no longer finds its grant answers what the first
//     release of that owner did: nil if it released the grant (go-redis
//     resends a script whose reply was lost, on a new connection, with its
//     default MaxRetries; the resent request is a release, not a loss), or
//     driver.ErrNotHeld if it had found the grant lost.
//
// The cost: one more EXISTS in the acquire script and one SET in the
// release script (measured on Redis 7.0 with BenchmarkCycle: 9.2 to 13.3
// microseconds of server time per script call, averaged over acquire and
// release; the round trip dominates a cycle either way), and one key per
// ended owner, living max(2 TTL, 10 s): about 150 bytes (MEMORY USAGE)
// for a 60-byte key name, so 1,000 releases a second with TTLs up to 5 s
// keep about 10,000 tombstones, some 2 MB. Keys
// with a TTL are reclaimed by Redis's active expiry; under maxmemory with a
// volatile-* or allkeys-* eviction policy a tombstone can be evicted early,
// and it is lost with the data (FLUSHALL, a restart without persistence,
// a failover to a replica that had not received it). Its limits: an
// acquire request delayed past the tombstone's life (in a proxy, a
// partition) can still grant the name to an owner nobody holds; that grant
// lasts one TTL, as a crashed holder's would, and its token is the highest,
// so fencing still rejects the writes of every earlier holder. Processes
// of a version without tombstones neither write nor honour them: run one
// version at a time.
//
// # Fencing tokens and what survives data loss
//
// A token is the larger of (the last token granted for the name + 1) and
// the Redis server's clock in microseconds since the Unix epoch, read with
// TIME inside the acquire script. So tokens strictly grow while the counter
// key survives, and keep growing after it is lost (FLUSHALL, a restart
// without persistence, eviction of the key, a failover to a replica that had
// not received the last grants): the first grant afterwards gets the
// server's current time in microseconds, greater than every earlier token
// as long as the clock of the server that grants it reads later than the
// clocks of the servers that granted the earlier ones did at the time. That
// is the assumption: a server's clock is never stepped back, and the clocks
// of servers that can replace each other (Sentinel or Cluster failover)
// differ by less than the time a failover takes. Tokens stay below 2^53
// until the year 2255.
//
// # Deployments: standalone, Sentinel, Cluster
//
// What holds on each, as measured by this package's tests on real
// deployments (docs/redis.md has the method and every figure):
//
//   - Tokens only grow across failovers, including to a replica that had
//     not received the last grants (its counter is behind, the TIME floor
//     is not), under the clock assumption above.
//   - Exclusivity holds across a manual failover (CLUSTER FAILOVER,
//     SENTINEL FAILOVER: no grant lost, no renewal failed). A failover to a
//     replica that lagged can lose a grant, because replication is
//     asynchronous: another client is then granted the lease at once, and
//     the first holder learns of the loss at its next renewal that reaches
//     the new primary (LostTakenOver; its renewals never re-create the
//     grant). Until then two holders overlap, and only fencing at the store
//     keeps the data safe (packages sqlguard and blobguard): in the tests,
//     every write of the older holder was rejected as stale.
//   - Takeover after a SIGKILLed primary: a waiting client was granted a
//     lost lease 2.3-5.3 s after the kill on a Cluster with node timeout
//     1 s, and 1.4-3.8 s with Sentinel (down-after 1 s).
//   - On a Cluster, New wraps the client so that a request that got no
//     reply reloads the slot map (go-redis issue 3979: otherwise requests
//     for a dead master's slots keep going to its address for up to
//     ClusterStateReloadInterval, 60 s by default).
//   - One round trip per acquire, renew, release and abandon; a batch of
//     heartbeats costs one pipeline per master holding some of its leases,
//     sent concurrently and each answered on its own: a master that stalls
//     (paused, overloaded) costs only the leases it serves; those on the
//     other masters are renewed as usual (RenewBatch).
//   - Release notices use sharded pub/sub on Redis 7 (one cluster-bus
//     message per release instead of one per node), waiters woken in
//     milliseconds, also across failovers.
//
// Use a client with ContextTimeoutEnabled set, so that a request's context
// bounds the socket wait; a lease is declared lost at its local deadline
// either way.
//
// # Setup errors and Check
//
// An error that retrying cannot fix matches driver.ErrSetup and names the
// fix, so that a blocking Acquire returns it at once: refused credentials
// (NOAUTH, WRONGPASS), an ACL that refuses a command, key or channel
// fencekit needs (NOPERM, also from inside a script), a server without
// scripting, a database number the server does not have. READONLY (a
// replica during a failover), LOADING and connection errors are retried.
// Backend.Check (driver.Checker, Manager.Check) finds them at start-up
// without taking a lease.
package redislease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Client is the part of a go-redis v9 client the backend uses. Every
// redis.UniversalClient (*redis.Client, *redis.ClusterClient, a failover
// client) satisfies it, as does a wrapper that injects faults.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

var (
	_ Client         = redis.UniversalClient(nil)
	_ driver.Backend = (*Backend)(nil)
	_ driver.Watcher = (*Backend)(nil)

	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.Checker      = (*Backend)(nil)
)

var (
	// ErrClosed is returned by Watch after Close.
	ErrClosed = errors.New("redislease: backend closed")
	// ErrInvalidOptions is matched by New's error for unusable options.
	ErrInvalidOptions = errors.New("redislease: invalid options")
)

var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redis.NewScript(acquireSrc)
	//go:embed renew.lua
	renewSrc    string
	renewScript = redis.NewScript(renewSrc)
	//go:embed release.lua
	releaseSrc     string
	releaseScripts = publishing(releaseSrc)
	//go:embed abandon.lua
	abandonSrc     string
	abandonScripts = publishing(abandonSrc)
	//go:embed holder.lua
	holderSrc    string
	holderScript = redis.NewScript(holderSrc)
)

// publishing returns the two forms of a script that publishes release
// notices (release.lua, abandon.lua): [sharded] publishes with SPUBLISH,
// falling back to PUBLISH on a server without it; [classic] with PUBLISH
// (Options.ClassicPubSub). The form is chosen once per Backend, so that
// no request carries it.
func publishing(src string) [2]*redis.Script {
	return [2]*redis.Script{
		sharded: redis.NewScript("local notice = 'SPUBLISH'\n" + src),
		classic: redis.NewScript("local notice = 'PUBLISH'\n" + src),
	}
}

// The indexes of publishing's forms.
const (
	sharded = 0
	classic = 1
)

// Options configures a Backend. New starts from the defaults documented on
// each field and applies each Option in turn.
type Options struct {
	// Prefix starts every key and channel name. Default "fencekit:". It
	// must not contain '{' or '}' (they would break the hash tags).
	Prefix string

	// ClassicPubSub makes releases publish with PUBLISH and waiters
	// subscribe with SUBSCRIBE, as fencekit did before it used sharded
	// pub/sub. Default false: SPUBLISH and SSUBSCRIBE where the server has
	// them (Redis 7.0+; on a Cluster a notice then reaches only its shard's
	// nodes instead of every node), PUBLISH and SUBSCRIBE where it does
	// not. A waiter of one kind does not hear a release of the other kind
	// and only polls (Options.PollInterval of package lease): during a
	// rolling upgrade from a version without sharded pub/sub, set it on
	// every process until all are upgraded. (Versions that kept the lease
	// in a hash rather than the string "<token>:<owner>" cannot share a
	// store with this one at all: their scripts and these answer WRONGTYPE
	// to each other's keys, which grants nothing twice but grants nothing;
	// stop them all to upgrade.)
	ClassicPubSub bool
}

// Option sets fields of Options; any func(*Options) is one.
type Option func(*Options)

// WithPrefix sets Options.Prefix.
func WithPrefix(prefix string) Option { return func(o *Options) { o.Prefix = prefix } }

// WithClassicPubSub sets Options.ClassicPubSub.
func WithClassicPubSub() Option { return func(o *Options) { o.ClassicPubSub = true } }

// Backend stores leases in Redis. It is safe for concurrent use. Call Close
// when done to end its pub/sub connection.
type Backend struct {
	c      Client
	prefix string
	hub    *hub
	notice string // check.lua's ARGV[2]: "sharded" or "classic"
	// release and abandon are the forms of release.lua and abandon.lua
	// that publish as the hub subscribes (publishing).
	release, abandon *redis.Script
	// nodes is the Cluster client's slot map (nil for a standalone or
	// Sentinel client, or a wrapper without MasterForKey): RenewBatch sends
	// one pipeline per master with it, concurrently.
	nodes masterForKeyer
}

// masterForKeyer is implemented by go-redis's *redis.ClusterClient: it
// returns the client of the master that serves key's hash slot, from the
// client's current slot map.
type masterForKeyer interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// New returns a Backend over c. It does no I/O: scripts are loaded on first
// use (EVALSHA, falling back to EVAL once).
func New(c Client, opts ...Option) (*Backend, error) {
	o := Options{Prefix: "fencekit:"}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var errs []error
	if c == nil {
		errs = append(errs, fmt.Errorf("%w: client is nil", ErrInvalidOptions))
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("%w: prefix %q contains a brace", ErrInvalidOptions, o.Prefix))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// The hub gets the client itself: it asks it for sharded pub/sub and
	// for its slot map.
	notice, form := "sharded", sharded
	if o.ClassicPubSub {
		notice, form = "classic", classic
	}
	nodes, _ := c.(masterForKeyer)
	return &Backend{c: withSlotReload(c), prefix: o.Prefix, hub: newHub(c, o.ClassicPubSub), notice: notice,
		release: releaseScripts[form], abandon: abandonScripts[form], nodes: nodes}, nil
}

// Keys are the Redis names used for one lease name.
type Keys struct {
	// Lease is the string "<token>:<owner>" of the current grant, with the
	// grant's TTL.
	Lease string
	// Token is the counter holding the last token granted.
	Token string
	// Channel is where a release is published.
	Channel string
	// Line is the sorted set of the owners waiting in line
	// (driver.Request.Queue), scored by arrival; Places the same owners
	// scored by when each place lapses (server time, milliseconds).
	Line, Places string
	// An ended owner's tombstone is "<prefix>{<name>}:ended:<owner>" (see
	// the package doc): one per owner, so it has no field here.
}

var nameEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// KeysFor returns the keys the backend uses for the lease name.
func (b *Backend) KeysFor(name string) Keys {
	lk, tk, ch := b.keys(name, "lease", "token", "released")
	line, places, _ := b.keys(name, "line", "places", "")
	return Keys{Lease: lk, Token: tk, Channel: ch, Line: line, Places: places}
}

// keys returns the names "<prefix>{<name>}:<suffix>" for two or three
// suffixes (c may be empty), built in one allocation: they are substrings of
// one string.
func (b *Backend) keys(name, a, c, d string) (string, string, string) {
	esc := nameEscaper.Replace(name)
	base := len(b.prefix) + len(esc) + 3
	var sb strings.Builder
	sb.Grow(3*base + len(a) + len(c) + len(d))
	for _, suffix := range [...]string{a, c, d} {
		if suffix == "" {
			continue
		}
		sb.WriteString(b.prefix)
		sb.WriteByte('{')
		sb.WriteString(esc)
		sb.WriteString("}:")
		sb.WriteString(suffix)
	}
	all := sb.String()
	i, j := base+len(a), base+len(a)
	if c != "" {
		j += base + len(c)
	}
	return all[:i], all[i:j], all[j:]
}

// leaseKey returns the key of name's lease alone.
func (b *Backend) leaseKey(name string) string {
	k, _, _ := b.keys(name, "lease", "", "")
	return k
}

// endedKey returns the key of owner's tombstone for name:
// "<prefix>{<name>}:ended:<owner>".
func (b *Backend) endedKey(name, owner string) string {
	k, _, _ := b.keys(name, endedSuffix+owner, "", "")
	return k
}

// grantValue is what the lease key holds for g: "<token>:<owner>", so that
// renew and release compare both in one string comparison.
func grantValue(g driver.Grant) string {
	var num [20]byte
	tok := strconv.AppendUint(num[:0], uint64(g.Token), 10)
	var sb strings.Builder
	sb.Grow(len(tok) + 1 + len(g.Owner))
	sb.Write(tok)
	sb.WriteByte(':')
	sb.WriteString(g.Owner)
	return sb.String()
}

// MinTTL is the shortest TTL the Redis backend accepts: shorter ones leave
// no room for a renewal round trip.
const MinTTL = 10 * time.Millisecond

// Limits implements driver.Backend: TTLs are whole milliseconds (PEXPIRE),
// at least MinTTL; waiters are kept in line (driver.Request.Queue) in two
// sorted sets in the lease's hash slot (Keys.Line, Keys.Places).
func (b *Backend) Limits() driver.Limits {
	return driver.Limits{MinTTL: MinTTL, Resolution: time.Millisecond, Queues: true}
}

func ttlMillis(ttl time.Duration) (int64, error) {
	if ttl < time.Millisecond || ttl%time.Millisecond != 0 {
		return 0, fmt.Errorf("redislease: TTL %v is not a positive whole number of milliseconds", ttl)
	}
	return ttl.Milliseconds(), nil
}

// endedSuffix starts the suffix of an owner's tombstone key:
// "<prefix>{<name>}:ended:<owner>". The owner follows the hash tag, so
// the tombstone shares the lease's hash slot whatever the owner holds.
const endedSuffix = "ended:"

// endedMillis is the life of a tombstone for leases of the given TTL:
// driver.EndedOwnerTTL, rounded up to whole milliseconds.
func endedMillis(ttl time.Duration) int64 {
	d := driver.EndedOwnerTTL(ttl)
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Acquire implements driver.Backend in one script call. It refuses, with an
// error matching driver.ErrNotAcquired, an owner whose tombstone is still
// there (released or abandoned within driver.EndedOwnerTTL). With
// req.Queue, the same script keeps req.Owner's place in line (Keys.Line,
// Keys.Places) and grants a free name only to the first live waiter. An
// error that retrying cannot fix (see Check) matches driver.ErrSetup.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	ms, err := ttlMillis(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	lk, tk, ek := b.keys(req.Name, "lease", "token", endedSuffix+req.Owner)
	if req.Queue {
		return b.acquireQueued(ctx, req, []string{lk, tk, ek}, ms)
	}
	v, err := acquireScript.Run(ctx, b.c, []string{lk, tk, ek}, req.Owner, ms).Int64()
	if err != nil {
		return driver.Grant{}, fmt.Errorf("redislease: acquire %q: %w", req.Name, b.setup(err))
	}
	return acquired(req, v)
}

// acquireQueued is Acquire for a waiter in line (driver.Request.Queue):
// the same script with the line's two keys, in the lease's hash slot.
func (b *Backend) acquireQueued(ctx context.Context, req driver.Request, keys []string, ms int64) (driver.Grant, error) {
	line, places, ch := b.keys(req.Name, "line", "places", "released")
	res, err := acquireScript.Run(ctx, b.c, append(keys, line, places), req.Owner, ms).Result()
	if err != nil {
		return driver.Grant{}, fmt.Errorf("redislease: acquire %q: %w", req.Name, b.setup(err))
	}
	switch v := res.(type) {
	case int64:
		if v < 0 {
			b.hub.inLine(ch, false) // releases wake this name's waiters in order
		}
		return acquired(req, v)
	case []any:
		// {ahead, ms}: the name is free, kept for earlier waiters. The
		// release woke this waiter before the first in line: wake the
		// next.
		b.hub.inLine(ch, true)
		if len(v) == 2 {
			ahead, ok1 := v[0].(int64)
			left, ok2 := v[1].(int64)
			if ok1 && ok2 {
				return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, Ahead: int(ahead), RetryAfter: time.Duration(max(left, 0)) * time.Millisecond}
			}
		}
	}
	return driver.Grant{}, fmt.Errorf("redislease: acquire %q: unexpected reply %v", req.Name, res)
}

// acquired reads acquire.lua's number: a token, 0 for an ended owner, or
// -pttl - 1 for a name another owner holds.
func acquired(req driver.Request, v int64) (driver.Grant, error) {
	if v < 0 {
		// -pttl - 1: held by another owner, for pttl more milliseconds.
		return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, RetryAfter: time.Duration(max(-v-1, 0)) * time.Millisecond}
	}
	if v == 0 {
		return driver.Grant{}, fmt.Errorf("%w: %q: owner %q was released or abandoned; the store refuses it for %v after that",
			driver.ErrNotAcquired, req.Name, req.Owner, driver.EndedOwnerTTL(req.TTL))
	}
	tok := uint64(v)
	return driver.Grant{Name: req.Name, Owner: req.Owner, Token: fence.Token(tok), TTL: req.TTL}, nil
}

// Renew implements driver.Backend in one script call: it extends the grant
// only if the lease key still holds g's owner and token.
func (b *Backend) Renew(ctx context.Context, g driver.Grant) error {
	ms, err := ttlMillis(g.TTL)
	if err != nil {
		return err
	}
	n, err := renewScript.Run(ctx, b.c, []string{b.leaseKey(g.Name)}, grantValue(g), ms).Int64()
	if err != nil {
		return fmt.Errorf("redislease: renew %q: %w", g.Name, b.setup(err))
	}
	if n != 1 {
		return driver.ErrNotHeld
	}
	return nil
}

// RenewBatch implements driver.BatchRenewer: the renew scripts go out in
// pipelines, and each grant's outcome is reported when its pipeline is
// answered.
//
// On a Redis Cluster client (*redis.ClusterClient, or any Client with its
// MasterForKey method) the grants are grouped by the master that serves
// their hash slot in the client's current slot map, and each group is one
// pipeline, all sent concurrently: a master that stalls holds up only its
// own grants (until ctx ends), while the grants on the masters that answer
// are reported at once. A grant whose master the client cannot name yet
// (no slot map) goes in a group of its own kind, sent the same way. A
// pipeline still follows MOVED and ASK redirections within the client, so
// a stale slot map costs time, not correctness. Any other client sends one
// pipeline for the whole batch and reports after it.
//
// If the server has lost the script (NOSCRIPT), a group is sent once more
// with the script's body.
func (b *Backend) RenewBatch(ctx context.Context, gs []driver.Grant, done func(i int, err error)) {
	groups := b.groupByNode(ctx, gs)
	if len(groups) == 1 {
		b.renewGroup(ctx, gs, groups[0], done)
		return
	}
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Go(func() { b.renewGroup(ctx, gs, idx, done) })
	}
	wg.Wait()
}

// groupByNode returns the indexes of gs grouped by the master that serves
// their lease keys, or all of them in one group when the client is not a
// Cluster client. A master is looked up once per hash slot.
func (b *Backend) groupByNode(ctx context.Context, gs []driver.Grant) [][]int {
	all := func() [][]int {
		idx := make([]int, len(gs))
		for i := range idx {
			idx[i] = i
		}
		return [][]int{idx}
	}
	if b.nodes == nil || len(gs) < 2 {
		return all()
	}
	// Grants whose master the slot map cannot name share the group of
	// the empty address.
	nodeOfSlot := make(map[int]string)
	group := make(map[string]int) // node address -> index in groups
	var groups [][]int
	for i, g := range gs {
		key := b.leaseKey(g.Name)
		slot := slotOf(key)
		addr, ok := nodeOfSlot[slot]
		if !ok {
			if c, err := b.nodes.MasterForKey(ctx, key); err == nil && c != nil {
				addr = c.Options().Addr
			}
			nodeOfSlot[slot] = addr
		}
		j, ok := group[addr]
		if !ok {
			j = len(groups)
			group[addr] = j
			groups = append(groups, nil)
		}
		groups[j] = append(groups[j], i)
	}
	return groups
}

// renewGroup sends the renewals of gs[idx] in one pipeline and reports
// each outcome through done.
func (b *Backend) renewGroup(ctx context.Context, gs []driver.Grant, idx []int, done func(int, error)) {
	send := idx[:0:0]
	for _, i := range idx {
		if _, err := ttlMillis(gs[i].TTL); err != nil {
			done(i, err)
			continue
		}
		send = append(send, i)
	}
	if len(send) == 0 {
		return
	}
	// run sends the group's renewals in one pipeline: by SHA, or, after
	// the server answered NOSCRIPT, with the script's body (which also
	// caches it), so a lost script cache costs one more round trip, not
	// two.
	run := func(withBody bool) []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(send))
		_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k, i := range send {
				g := gs[i]
				ms, _ := ttlMillis(g.TTL)
				keys := []string{b.leaseKey(g.Name)}
				if withBody {
					cmds[k] = renewScript.Eval(ctx, p, keys, grantValue(g), ms)
				} else {
					cmds[k] = renewScript.EvalSha(ctx, p, keys, grantValue(g), ms)
				}
			}
			return nil
		})
		return cmds
	}
	cmds := run(false)
	if hasNoScript(cmds) {
		cmds = run(true)
	}
	for k, cmd := range cmds {
		i := send[k]
		switch n, err := cmd.Int64(); {
		case err != nil:
			done(i, fmt.Errorf("redislease: renew %q: %w", gs[i].Name, b.setup(err)))
		case n != 1:
			done(i, driver.ErrNotHeld)
		default:
			done(i, nil)
		}
	}
}

func hasNoScript(cmds []*redis.Cmd) bool {
	for _, c := range cmds {
		if c != nil && c.Err() != nil && strings.HasPrefix(c.Err().Error(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// Release implements driver.Backend in one script call: it deletes the grant
// only if the lease key still holds g's owner and token, and then publishes
// on the release channel. Whatever the outcome, it leaves g.Owner's
// tombstone (PX driver.EndedOwnerTTL(g.TTL)), which records how the owner
// ended. When the lease no longer holds g, it returns nil if the tombstone
// says an earlier release released it (this release resent: go-redis
// retries a script whose reply was lost, on a new connection) or an
// Abandon ended it, and driver.ErrNotHeld otherwise, including when an
// earlier release of g had found it lost already: a resent release
// answers what the first one did, so a loss is never reported as a
// release, nor a release as a loss.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	lk, ek, ch := b.keys(g.Name, "lease", endedSuffix+g.Owner, "released")
	n, err := b.release.Run(ctx, b.c, []string{lk, ek}, grantValue(g), ch, endedMillis(g.TTL)).Int64()
	if err != nil {
		return fmt.Errorf("redislease: release %q: %w", g.Name, b.setup(err))
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// Abandon implements driver.Backend in one script call: it writes
// req.Owner's tombstone (PX driver.EndedOwnerTTL(req.TTL)), so that
// req's acquire request is refused if it reaches Redis later, and deletes
// the lease if req.Owner holds it (any token), publishing on the release
// channel as Release does. With req.Queue it also removes req.Owner's
// place in line, publishing when that makes the next waiter first.
func (b *Backend) Abandon(ctx context.Context, req driver.Request) error {
	lk, ek, ch := b.keys(req.Name, "lease", endedSuffix+req.Owner, "released")
	keys := []string{lk, ek}
	if req.Queue {
		line, places, _ := b.keys(req.Name, "line", "places", "")
		keys = append(keys, line, places)
	}
	if err := b.abandon.Run(ctx, b.c, keys, req.Owner, ch, endedMillis(req.TTL)).Err(); err != nil {
		return fmt.Errorf("redislease: abandon %q for owner %q: %w", req.Name, req.Owner, b.setup(err))
	}
	return nil
}

// Holder implements driver.Inspector in one script call.
func (b *Backend) Holder(ctx context.Context, name string) (driver.Holder, error) {
	res, err := holderScript.Run(ctx, b.c, []string{b.leaseKey(name)}).Slice()
	switch {
	case errors.Is(err, redis.Nil):
		return driver.Holder{}, driver.ErrNotHeld
	case err != nil:
		return driver.Holder{}, fmt.Errorf("redislease: holder of %q: %w", name, b.setup(err))
	case len(res) != 2:
		return driver.Holder{}, fmt.Errorf("redislease: holder of %q: unexpected reply %v", name, res)
	}
	v, _ := res[0].(string)
	tokS, owner, ok := strings.Cut(v, ":")
	tok, perr := strconv.ParseUint(tokS, 10, 64)
	if !ok || perr != nil || tok == 0 {
		return driver.Holder{}, fmt.Errorf("redislease: holder of %q: the lease key holds %q, not a grant", name, v)
	}
	pttl, _ := res[1].(int64)
	return driver.Holder{Name: name, Owner: owner, Token: fence.Token(tok), Remaining: time.Duration(max(pttl, 0)) * time.Millisecond}, nil
}

// Watch implements driver.Watcher over one shared pub/sub connection. It
// returns once Redis has confirmed the subscription, bounded by ctx.
func (b *Backend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	ch, stop, err := b.hub.watch(ctx, b.KeysFor(name).Channel)
	return ch, stop, b.setup(err)
}

// Close ends the backend's pub/sub connection and its goroutines. It does
// not close the client. Leases already acquired keep working; Watch fails
// with ErrClosed afterwards.
func (b *Backend) Close() error { return b.hub.close() }
