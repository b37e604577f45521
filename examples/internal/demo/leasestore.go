package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

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
)

// LeaseStoreUsage is the --lease-store flag's help text.
const LeaseStoreUsage = "where leases live: redis (redislease), postgres (pglease table mode, in the run's schema: needs no Redis) or postgres-session (pglease session mode: advisory locks)"

// CheckLeaseStore returns an error for a --lease-store value that is not
// one of the above.
func CheckLeaseStore(s string) error {
	switch s {
	case LeaseRedis, LeasePostgres, LeasePostgresSession:
		return nil
	}
	return fmt.Errorf("--lease-store %q: want %s, %s or %s", s, LeaseRedis, LeasePostgres, LeasePostgresSession)
}

// LeaseStore says where a child process's leases live.
type LeaseStore struct {
	Kind        string `json:"kind"` // LeaseRedis, LeasePostgres or LeasePostgresSession
	RedisURL    string `json:"redis_url,omitempty"`
	RedisPrefix string `json:"redis_prefix,omitempty"`
	PostgresURL string `json:"postgres_url,omitempty"`
	// Schema holds pglease's tables (created by fencekit's migrations).
	Schema string `json:"schema,omitempty"`
}

// Describe names the store for the demo's output.
func (s LeaseStore) Describe() string {
	switch s.Kind {
	case LeasePostgres:
		return fmt.Sprintf("PostgreSQL, table %s.%s (pglease, table mode)", s.Schema, pglease.LeaseTable)
	case LeasePostgresSession:
		return fmt.Sprintf("PostgreSQL advisory locks, tokens in %s.%s (pglease, session mode)", s.Schema, pglease.SessionLeaseTable)
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
// nobody renews it, read from the store: Redis PTTL, or the expiry in
// pglease's table. In session mode a grant lasts as long as its session,
// which ends when the holder's process dies (its socket closes) or after
// the TTL of idleness: LeaseLeft then returns 0 once the session that took
// the lock is gone, and at most ttl while it lives.
func (st *Stores) LeaseLeft(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	switch st.LeaseStore {
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
