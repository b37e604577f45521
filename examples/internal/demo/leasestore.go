package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
)

// The lease stores a demo can use (its --lease-store flag).
const (
	// LeaseRedis keeps leases in Redis (package redislease).
	LeaseRedis = "redis"
	// LeasePostgres keeps leases in a PostgreSQL table (package pglease,
	// table mode), in the run's schema: no Redis needed.
	LeasePostgres = "postgres"
	// LeasePostgresSession keeps leases as PostgreSQL advisory locks on
	// pinned sessions (package pglease, session mode).
	LeasePostgresSession = "postgres-session"
	// LeaseEtcd keeps leases in etcd (package etcdlease): TTLs in whole
	// seconds.
	LeaseEtcd = "etcd"
	// LeaseZooKeeper keeps leases as ephemeral sequential nodes in
	// ZooKeeper (package zklease), one session per process with the TTL
	// as its timeout.
	LeaseZooKeeper = "zookeeper"
	// LeaseDynamoDB: see dynamo.go.
)

// LeaseStoreUsage is the --lease-store flag's help text.
const LeaseStoreUsage = "where leases live: redis (redislease), postgres (pglease table mode, in the run's schema: needs no Redis),\n" +
	"postgres-session (pglease session mode: advisory locks), etcd (etcdlease: $FENCE_ETCD_ENDPOINTS, else\n" +
	"127.0.0.1:2379, else one it builds once and starts; TTLs in whole seconds) or zookeeper (zklease:\n" +
	"$FENCE_ZK_SERVERS, else 127.0.0.1:2181, else a server it starts from Debian's zookeeper package)\n" +
	"or dynamodb (dynamolease: table " + DynamoTable + " at $FENCE_DYNAMODB_ENDPOINT, e.g. DynamoDB Local started by\n" +
	"scripts/services.sh's ensure_dynamodb; waiters poll)"

// CheckLeaseStore returns an error for a --lease-store value that is not
// one of the above.
func CheckLeaseStore(s string) error {
	switch s {
	case LeaseRedis, LeasePostgres, LeasePostgresSession, LeaseEtcd, LeaseZooKeeper, LeaseDynamoDB:
		return nil
	}
	return fmt.Errorf("--lease-store %q: want %s, %s, %s, %s, %s or %s", s, LeaseRedis, LeasePostgres, LeasePostgresSession, LeaseEtcd, LeaseZooKeeper, LeaseDynamoDB)
}

// CheckTTL returns an error for a TTL the lease store cannot take, before
// any service is looked for: etcd counts TTLs in whole seconds, from 1 s
// (the server the programs start; a server with etcd's default timing
// refuses less than 2 s, which the Manager then reports).
func CheckTTL(store string, ttl time.Duration) error {
	if store == LeaseEtcd && (ttl < time.Second || ttl%time.Second != 0) {
		return fmt.Errorf("--ttl %v: etcd counts lease TTLs in whole seconds, from 1s: use --ttl 1s, 2s or more", ttl)
	}
	return nil
}

// ServicesConfig returns what services.Provide must find for the lease
// store (the rest of cfg is the caller's).
func ServicesConfig(store string, cfg services.Config) services.Config {
	cfg.NoRedis = store != LeaseRedis
	cfg.Etcd = store == LeaseEtcd
	cfg.ZooKeeper = store == LeaseZooKeeper
	return cfg
}

// LeaseStore says where a child process's leases live.
type LeaseStore struct {
	Kind        string `json:"kind"` // one of the Lease* constants
	RedisURL    string `json:"redis_url,omitempty"`
	RedisPrefix string `json:"redis_prefix,omitempty"`
	PostgresURL string `json:"postgres_url,omitempty"`
	// Schema holds pglease's tables (created by fencekit's migrations).
	Schema string `json:"schema,omitempty"`
	// EtcdEndpoints are etcd's client URLs; EtcdMinTTL is the shortest TTL
	// its server grants (0: etcdlease's default, that of etcd's default
	// timing).
	EtcdEndpoints []string      `json:"etcd_endpoints,omitempty"`
	EtcdMinTTL    time.Duration `json:"etcd_min_ttl_ns,omitempty"`
	// ZooKeeperServers are the ensemble's client addresses; ZooKeeperTick
	// its tickTime (0: unknown).
	ZooKeeperServers []string      `json:"zk_servers,omitempty"`
	ZooKeeperTick    time.Duration `json:"zk_tick_ns,omitempty"`
	// ZooKeeperBounds names the session timeouts the server grants, when
	// known (the server services.Provide started).
	ZooKeeperBounds string `json:"zk_bounds,omitempty"`
	// DynamoEndpoint and DynamoTable say where DynamoDB leases live.
	DynamoEndpoint string `json:"dynamodb_endpoint,omitempty"`
	DynamoTable    string `json:"dynamodb_table,omitempty"`
}

// StoreFor returns the LeaseStore of kind over the services svc found.
func StoreFor(kind string, svc *services.Set) LeaseStore {
	st := LeaseStore{Kind: kind, RedisURL: svc.RedisURL, PostgresURL: svc.PostgresURL,
		EtcdEndpoints: svc.EtcdEndpoints, ZooKeeperServers: svc.ZooKeeperServers, ZooKeeperTick: svc.ZooKeeperTick}
	if svc.EtcdStarted {
		st.EtcdMinTTL = services.EtcdMinTTL
	}
	if svc.ZooKeeperStarted {
		st.ZooKeeperBounds = services.ZooKeeperSessionBounds
	}
	return dynamoStore(st)
}

// defaultZooKeeperTick is ZooKeeper's default tickTime, assumed for a
// server whose tick is not known.
const defaultZooKeeperTick = 2 * time.Second

// ExpiryLag is how long past its TTL (counted from its last renewal) the
// store may keep the grant of a holder that died, before a waiter can have
// it: etcd revokes expired leases every 500 ms; ZooKeeper ends an expired
// session at its next tick; Redis and PostgreSQL end a grant at its TTL.
func (s LeaseStore) ExpiryLag() time.Duration {
	switch s.Kind {
	case LeaseEtcd:
		return 500 * time.Millisecond
	case LeaseZooKeeper:
		if s.ZooKeeperTick > 0 {
			return s.ZooKeeperTick
		}
		return defaultZooKeeperTick
	case LeaseDynamoDB:
		return dynamoLag
	}
	return 0
}

// WakeUps says how the store wakes a lease's waiters on a release.
func (s LeaseStore) WakeUps() string {
	switch s.Kind {
	case LeasePostgres, LeasePostgresSession:
		return "PostgreSQL NOTIFY"
	case LeaseEtcd:
		return "an etcd watch on the lease's key"
	case LeaseZooKeeper:
		return "a ZooKeeper watch on the node before theirs"
	case LeaseDynamoDB:
		return "their next poll: DynamoDB pushes nothing"
	}
	return "Redis pub/sub"
}

// Name names the store in a sentence ("its lease has 2s left in Redis").
func (s LeaseStore) Name() string {
	switch s.Kind {
	case LeasePostgres, LeasePostgresSession:
		return "PostgreSQL"
	case LeaseEtcd:
		return "etcd"
	case LeaseZooKeeper:
		return "ZooKeeper"
	case LeaseDynamoDB:
		return "DynamoDB"
	}
	return "Redis"
}

// Describe names the store for the demo's output.
func (s LeaseStore) Describe() string {
	switch s.Kind {
	case LeasePostgres:
		return fmt.Sprintf("PostgreSQL, table %s.%s (pglease, table mode)", s.Schema, pglease.LeaseTable)
	case LeasePostgresSession:
		return fmt.Sprintf("PostgreSQL advisory locks, tokens in %s.%s (pglease, session mode)", s.Schema, pglease.SessionLeaseTable)
	case LeaseEtcd:
		return fmt.Sprintf("etcd at %s (etcdlease: tokens are revisions on an epoch base)", strings.Join(s.EtcdEndpoints, ","))
	case LeaseZooKeeper:
		return fmt.Sprintf("ZooKeeper at %s (zklease: ephemeral sequential nodes, tokens are their czxids)", strings.Join(s.ZooKeeperServers, ","))
	case LeaseDynamoDB:
		return fmt.Sprintf("DynamoDB at %s, table %s (dynamolease: one item per lease, takeover after a TTL of an unchanged record version)", s.DynamoEndpoint, s.DynamoTable)
	}
	return "Redis (redislease)"
}

// NewLeaseManager returns, for a child process, a lease.Manager on the
// lease store, and a function that closes the backend and its client. The
// Manager logs its warnings (an acquire attempt that failed and will be
// retried, a lost lease) on stderr, which is the orchestrator's; opts come
// after that and may replace it.
func NewLeaseManager(store LeaseStore, ttl time.Duration, opts ...lease.Option) (*lease.Manager, func(), error) {
	var (
		backend  lease.Backend
		closeAll func()
	)
	switch store.Kind {
	case LeasePostgres, LeasePostgresSession:
		pool, err := pgxpool.New(context.Background(), store.PostgresURL)
		if err != nil {
			return nil, nil, fmt.Errorf("postgres URL: %w", err)
		}
		mode := pglease.ModeTable
		if store.Kind == LeasePostgresSession {
			mode = pglease.ModeSession
		}
		b, err := pglease.New(pool, pglease.WithMode(mode), pglease.WithSchema(store.Schema))
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		backend, closeAll = b, func() { _ = b.Close(); pool.Close() }
	case LeaseEtcd, LeaseZooKeeper, LeaseDynamoDB:
		b, closeB, err := newConsensusBackend(store, ttl)
		if err != nil {
			return nil, nil, err
		}
		backend, closeAll = b, closeB
	default:
		ropt, err := redis.ParseURL(store.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("redis URL: %w", err)
		}
		ropt.ContextTimeoutEnabled = true
		rc := redis.NewClient(ropt)
		b, err := redislease.New(rc, func(o *redislease.Options) { o.Prefix = store.RedisPrefix })
		if err != nil {
			_ = rc.Close()
			return nil, nil, err
		}
		backend, closeAll = b, func() { _ = b.Close(); _ = rc.Close() }
	}
	warnings := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := lease.NewManager(backend, ttl, append([]lease.Option{lease.WithLogger(warnings)}, opts...)...)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return m, closeAll, nil
}

// LeaseLeft returns how long the store keeps the lease's current grant if
// nobody renews it, read from the store: Redis PTTL, the expiry in
// pglease's table, or the time to live of the grant's etcd lease (whole
// seconds). In session mode a grant lasts as long as its session, which
// ends when the holder's process dies (its socket closes) or after the TTL
// of idleness: LeaseLeft then returns 0 once the session that took the
// lock is gone, and at most ttl while it lives. ZooKeeper keeps a grant's
// node until its session expires, a session timeout (ttl) after the
// ensemble last heard from the holder, which it does not tell: LeaseLeft
// returns ttl while the node exists, 0 once it is gone.
func (st *Stores) LeaseLeft(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	switch st.LeaseStore {
	case LeaseEtcd, LeaseZooKeeper, LeaseDynamoDB:
		h, err := st.consensus.Holder(ctx, st.LeaseName)
		switch {
		case errors.Is(err, lease.ErrNotHeld):
			return 0, nil
		case err != nil:
			return 0, err
		case st.LeaseStore == LeaseZooKeeper, st.LeaseStore == LeaseDynamoDB:
			return ttl, nil
		}
		return h.Remaining, nil
	case LeasePostgres:
		var us int64
		err := st.Pool.QueryRow(ctx, `SELECT greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint) FROM `+
			pgx.Identifier{st.Schema, pglease.LeaseTable}.Sanitize()+` WHERE name = $1`, st.LeaseName).Scan(&us)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return time.Duration(us) * time.Microsecond, err
	case LeasePostgresSession:
		var alive bool
		err := st.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{st.Schema, pglease.SessionLeaseTable}.Sanitize()+
			` s JOIN pg_stat_activity a ON a.pid = s.backend_pid WHERE s.name = $1)`, st.LeaseName).Scan(&alive)
		if err != nil || !alive {
			return 0, err
		}
		return ttl, nil
	}
	left, err := st.Redis.PTTL(ctx, st.Keys.Lease).Result()
	return max(left, 0), err
}

// ChildLease is the part of a child process's configuration (StartChild)
// that says which lease it takes and where that lease lives: the same in
// both programs.
type ChildLease struct {
	RedisURL    string `json:"redis_url"`
	PostgresURL string `json:"postgres_url"`
	// Schema is the run's schema; PostgreSQL leases live there too.
	Schema      string `json:"schema"`
	LeaseName   string `json:"lease_name"`
	LeaseStore  string `json:"lease_store"` // one of the Lease* constants
	RedisPrefix string `json:"redis_prefix"`
	// Consensus says where etcd, ZooKeeper or DynamoDB are (LeaseStore
	// etcd, zookeeper or dynamodb).
	Consensus      LeaseStore    `json:"consensus"`
	TTL            time.Duration `json:"ttl"`
	AcquireTimeout time.Duration `json:"acquire_timeout"`
}

// NewChildLease returns the ChildLease of the lease name in the lease store
// kind, among the services svc found, for a run in schema; AcquireTimeout
// is left for each child.
func NewChildLease(svc *services.Set, kind, schema, name string, ttl time.Duration) ChildLease {
	return ChildLease{RedisURL: svc.RedisURL, PostgresURL: svc.PostgresURL, Schema: schema,
		LeaseName: name, LeaseStore: kind, RedisPrefix: "fencekit:", Consensus: StoreFor(kind, svc), TTL: ttl}
}

// Leases says where the lease lives.
func (c ChildLease) Leases() LeaseStore {
	s := c.Consensus
	s.Kind, s.RedisURL, s.RedisPrefix, s.PostgresURL, s.Schema = c.LeaseStore, c.RedisURL, c.RedisPrefix, c.PostgresURL, c.Schema
	return s
}
