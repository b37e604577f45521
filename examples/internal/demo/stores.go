package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/migrations"
)

// Stores is what one run works in: a throwaway PostgreSQL schema, and the
// Redis keys of its lease when its leases live in Redis (or a client of
// etcd or ZooKeeper when they live there).
type Stores struct {
	Schema string
	Pool   *pgxpool.Pool
	// LeaseStore and LeaseName repeat the StoresConfig.
	LeaseStore, LeaseName string
	// Redis is nil unless LeaseStore is LeaseRedis.
	Redis *redis.Client
	// Keys are the lease's keys in Redis.
	Keys redislease.Keys
	// consensus inspects the lease in etcd or ZooKeeper (nil elsewhere);
	// closeConsensus closes it and its client.
	consensus      consensusBackend
	closeConsensus func()

	// Strike the schema and the keys off the run's ledger (package
	// leftover) once they are removed or kept.
	schemaDone, keysDone func()
}

// StoresConfig says what SetUpStores prepares.
type StoresConfig struct {
	PostgresURL string
	// Schema is created by SetUpStores and dropped, with everything in
	// it, by TearDown.
	Schema string
	// CreateTables creates the program's own tables in Schema and fills
	// them.
	CreateTables func(ctx context.Context, pool *pgxpool.Pool) error
	// FencedTables are the tables, among those, that get a lock_version
	// column.
	FencedTables []string

	// LeaseStore is LeaseRedis (the default when empty), LeasePostgres or
	// LeasePostgresSession. PostgreSQL leases live in Schema, in the tables
	// fencekit's migrations create, and go with it.
	LeaseStore  string
	RedisURL    string
	RedisPrefix string
	LeaseName   string
	// Leases says where etcd or ZooKeeper are, when leases live there;
	// TTL is the leases' TTL, which SetUpStores checks the store can keep.
	Leases LeaseStore
	TTL    time.Duration

	// PostgresStarted and RedisStarted say that the servers are ones the
	// program started itself (services.Set): what they hold goes with
	// them, so a later sweep need not reach them.
	PostgresStarted, RedisStarted bool
}

// StoresConfig returns the StoresConfig of the run's schema and lease, on
// the services svc found or started; the program adds its tables
// (CreateTables, FencedTables).
func (c ChildLease) StoresConfig(svc *services.Set) StoresConfig {
	return StoresConfig{
		PostgresURL: svc.PostgresURL, Schema: c.Schema,
		LeaseStore: c.LeaseStore, RedisURL: svc.RedisURL, RedisPrefix: c.RedisPrefix, LeaseName: c.LeaseName,
		Leases: c.Leases(), TTL: c.TTL,
		PostgresStarted: svc.PostgresStarted, RedisStarted: svc.RedisStarted,
	}
}

// SetUpStores creates the schema and the program's tables in it, then does
// there what `fencekit migrate up` and `fencekit migrate add-lock-version`
// do: fencekit's own tables, and lock_version on the fenced tables. It
// connects to Redis and finds the lease's keys, when leases live there.
// The schema and the keys are recorded in the run's ledger (package
// leftover) before they exist, so that a run killed at any point leaves
// them to the next run's sweep. On error it has already torn down what it
// created.
func SetUpStores(ctx context.Context, cfg StoresConfig) (*Stores, error) {
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return nil, err
	}
	if cfg.LeaseStore == "" {
		cfg.LeaseStore = LeaseRedis
	}
	st := &Stores{Schema: cfg.Schema, Pool: pool, LeaseStore: cfg.LeaseStore, LeaseName: cfg.LeaseName}
	st.schemaDone = leftover.Track(leftover.Entry{Kind: leftover.KindSchema, URL: cfg.PostgresURL, Name: cfg.Schema, Ephemeral: cfg.PostgresStarted})
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{cfg.Schema}.Sanitize()); err != nil {
		pool.Close()
		st.schemaDone()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	if err := st.prepare(ctx, cfg); err != nil {
		_ = st.TearDown()
		return nil, err
	}
	return st, nil
}

func (st *Stores) prepare(ctx context.Context, cfg StoresConfig) error {
	if err := cfg.CreateTables(ctx, st.Pool); err != nil {
		return err
	}
	db, err := migrations.Open(cfg.PostgresURL, cfg.Schema)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		return fmt.Errorf("fencekit migrations: %w", err)
	}
	for _, t := range cfg.FencedTables {
		if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Schema: cfg.Schema, Name: t}); err != nil {
			return fmt.Errorf("add lock_version to %s: %w", t, err)
		}
	}
	switch cfg.LeaseStore {
	case LeaseEtcd, LeaseZooKeeper, LeaseDynamoDB:
		// Nothing to clean up there: a grant's key or node goes with its
		// etcd lease or ZooKeeper session, even when its holder is killed,
		// and a lease name's ZooKeeper parent is a container node, which
		// the server deletes once it is empty. etcdlease's epoch key stays:
		// it is what keeps tokens growing from one run to the next.
		b, closeB, err := newConsensusBackend(cfg.Leases, cfg.TTL)
		if err != nil {
			return err
		}
		st.consensus, st.closeConsensus = b, closeB
		return checkConsensusStore(ctx, b, cfg.Leases, cfg.TTL)
	case LeasePostgres, LeasePostgresSession:
		return nil // in the schema, which goes with the run
	}
	ropt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return err
	}
	st.Redis = redis.NewClient(ropt)
	b, err := redislease.New(st.Redis, func(o *redislease.Options) { o.Prefix = cfg.RedisPrefix })
	if err != nil {
		return err
	}
	st.Keys = b.KeysFor(cfg.LeaseName)
	_ = b.Close()
	st.keysDone = leftover.Track(leftover.Entry{Kind: leftover.KindRedisKeys, URL: cfg.RedisURL,
		Keys: []string{st.Keys.Lease, st.Keys.Token}, Ephemeral: cfg.RedisStarted})
	return nil
}

// Keep strikes the schema and the keys off the run's ledger without
// removing them (--keep), and closes the connections.
func (st *Stores) Keep() {
	st.Pool.Close()
	if st.Redis != nil {
		_ = st.Redis.Close()
	}
	st.closeLeases()
	st.strike()
}

func (st *Stores) strike() {
	for _, done := range []func(){st.schemaDone, st.keysDone} {
		if done != nil {
			done()
		}
	}
}

// TearDown drops the schema with everything in it, deletes the lease's
// keys, and closes the connections. It has its own timeout, so that it
// can run after the run's context is cancelled.
func (st *Stores) TearDown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var errs []error
	if _, err := st.Pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{st.Schema}.Sanitize()+" CASCADE"); err != nil {
		errs = append(errs, err)
	} else if st.schemaDone != nil {
		st.schemaDone()
	}
	st.Pool.Close()
	if st.Redis != nil {
		if err := st.Redis.Del(ctx, st.Keys.Lease, st.Keys.Token).Err(); err != nil {
			errs = append(errs, err)
		} else if st.keysDone != nil {
			st.keysDone()
		}
		_ = st.Redis.Close()
	}
	st.closeLeases()
	return errors.Join(errs...)
}

func (st *Stores) closeLeases() {
	if st.closeConsensus != nil {
		st.closeConsensus()
		st.closeConsensus = nil
	}
}
