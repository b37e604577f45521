package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/migrations"
)

// scenario is what one run works in: a MariaDB database of its own (the
// orders, fencekit's tables), the lease's keys in Redis under a prefix of
// the run's own, and the inventory service.
type scenario struct {
	id       string
	db       *demo.MySQLDatabase
	redisURL string
	prefix   string
	keys     redislease.Keys
	keysDone func() // strikes the keys off the run's ledger
	inv      *inventory
}

// orderAmount is what order id is worth, in cents.
func orderAmount(id int) int64 { return 1000 + 137*int64(id) }

// setUp makes the run's database, as a team would before the job's first
// night: `fencekit migrate up --dialect mysql` (the resource tokens and
// the ledger), the shop's tables, `fencekit migrate add-lock-version
// --table orders`, and tonight's open orders. It names the lease's keys
// in Redis and starts the inventory service. On error it has already
// removed what it made.
func setUp(ctx context.Context, svc *services.Set, o options) (*scenario, error) {
	sc := &scenario{id: demo.RandomID(), redisURL: svc.RedisURL}
	sc.prefix = "settleorders-" + sc.id + ":"
	var err error
	if sc.db, err = demo.CreateMySQLDatabase(ctx, o.mysqlURL, "settleorders_"+sc.id); err != nil {
		return nil, err
	}
	if err := sc.fill(ctx, o.orders); err != nil {
		return nil, errors.Join(err, sc.db.Drop())
	}
	ropt, err := redis.ParseURL(svc.RedisURL)
	if err != nil {
		return nil, errors.Join(err, sc.db.Drop())
	}
	rc := redis.NewClient(ropt)
	defer rc.Close()
	b, err := redislease.New(rc, redislease.WithPrefix(sc.prefix))
	if err != nil {
		return nil, errors.Join(err, sc.db.Drop())
	}
	sc.keys = b.KeysFor(job)
	_ = b.Close()
	sc.keysDone = leftover.Track(leftover.Entry{Kind: leftover.KindRedisKeys, URL: svc.RedisURL,
		Keys: []string{sc.keys.Lease, sc.keys.Token}, Ephemeral: svc.RedisStarted})
	if sc.inv, err = startInventory(); err != nil {
		sc.keysDone()
		return nil, errors.Join(err, sc.db.Drop())
	}
	return sc, nil
}

// fill creates the tables and tonight's orders.
func (sc *scenario) fill(ctx context.Context, orders int) error {
	db, err := sql.Open("mysql", sc.db.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db, migrations.WithDialect(migrations.DialectMySQL)); err != nil {
		return fmt.Errorf("fencekit migrations: %w", err)
	}
	for _, ddl := range []string{
		`CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR(64) NOT NULL, amount_cents BIGINT NOT NULL,
			status VARCHAR(16) NOT NULL DEFAULT 'open', settled_by VARCHAR(64) NULL, settled_token BIGINT UNSIGNED NULL)`,
		// No unique key on order_id: a second payout for an order would
		// be a row of its own, and the verdict would see it.
		`CREATE TABLE payouts (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id INT NOT NULL, amount_cents BIGINT NOT NULL,
			replica VARCHAR(64) NOT NULL, token BIGINT UNSIGNED NOT NULL)`,
		`CREATE TABLE settlement_runs (id BIGINT AUTO_INCREMENT PRIMARY KEY, period VARCHAR(32) NOT NULL,
			replica VARCHAR(64) NOT NULL, token BIGINT UNSIGNED NOT NULL, orders_settled INT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("create table: %w", err)
		}
	}
	if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Name: "orders"}, migrations.WithDialect(migrations.DialectMySQL)); err != nil {
		return err
	}
	for id := 1; id <= orders; id++ {
		if _, err := db.ExecContext(ctx, `INSERT INTO orders (id, customer, amount_cents) VALUES (?, ?, ?)`,
			id, fmt.Sprintf("customer-%03d", (id*7)%97), orderAmount(id)); err != nil {
			return fmt.Errorf("insert order %d: %w", id, err)
		}
	}
	return nil
}

// replicaConfig returns replica name's configuration.
func (sc *scenario) replicaConfig(name string, o options) replicaConfig {
	return replicaConfig{
		Name: name, TTL: o.ttl, MySQLDSN: sc.db.DSN, InventoryURL: sc.inv.url, Period: o.period,
		OrderTime: o.orderTime, StopAfter: []int{o.freezeAfter, o.freezeAfter + 1}, Budget: o.budget(),
		Leases: demo.LeaseStore{Kind: demo.LeaseRedis, RedisURL: sc.redisURL, RedisPrefix: sc.prefix},
	}
}

// tearDown removes what setUp made.
func (sc *scenario) tearDown(errOut io.Writer) {
	sc.inv.close()
	err := sc.db.Drop()
	if rerr := sc.deleteKeys(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		fmt.Fprintf(errOut, "settleorders: cleaning up: %v\n", err)
	}
}

func (sc *scenario) deleteKeys() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ropt, err := redis.ParseURL(sc.redisURL)
	if err != nil {
		return err
	}
	rc := redis.NewClient(ropt)
	defer rc.Close()
	if err := rc.Del(ctx, sc.keys.Lease, sc.keys.Token).Err(); err != nil {
		return err
	}
	sc.keysDone()
	return nil
}

// keep leaves the database and the keys in place (--keep) and says where
// they are.
func (sc *scenario) keep(out io.Writer) {
	sc.inv.close()
	sc.db.Keep()
	sc.keysDone()
	fmt.Fprintf(out, "\nKept (--keep):\n  MariaDB database %s at %s (DROP DATABASE %s when done)\n  lease keys %s and %s in %s\n",
		sc.db.Name, sc.db.Addr, sc.db.Name, sc.keys.Lease, sc.keys.Token, sc.redisURL)
}
