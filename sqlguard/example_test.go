package sqlguard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/sqlguard"
)

// exampleDB gives an example a pool on a fresh schema with fencekit's
// migrations applied and an orders table, and a function that drops it
// all. The examples need the PostgreSQL of FENCE_POSTGRES_URL (the tests
// always run against it).
func exampleDB() (*pgxpool.Pool, func()) {
	ctx := context.Background()
	var b [4]byte
	rand.Read(b[:])
	schema := "fk_example_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		log.Fatalf("examples need PostgreSQL at %s: %v", testenv.PostgresURL(), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}

	// What an application does once at deploy time (or: fencekit migrate up).
	db, err := migrations.Open(testenv.PostgresURL(), schema)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		log.Fatal(err)
	}
	db.Close()

	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (
		id int PRIMARY KEY,
		status text NOT NULL,
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0));
		INSERT INTO orders (id, status) VALUES (42, 'new')`); err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		c, err := pgx.Connect(ctx, testenv.PostgresURL())
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			log.Fatal(err)
		}
	}
}

// A holder with token 7 updates an order; a paused holder that still
// believes it holds the lease, with the older token 6, is rejected by the
// database and told which token won.
func ExampleTable_Update() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	orders, err := sqlguard.NewTable("", "orders", "id")
	if err != nil {
		log.Fatal(err)
	}

	err = orders.Update(ctx, pool, []any{42}, 7, sqlguard.Col("status", "paid"))
	fmt.Println("token 7:", err)

	err = orders.Update(ctx, pool, []any{42}, 6, sqlguard.Col("status", "cancelled"))
	fmt.Println("token 6:", err)
	if se, ok := fence.AsStale(err); ok {
		fmt.Println("stale; the row was written with token", se.Current)
	}

	var status string
	if err := pool.QueryRow(ctx, "SELECT status FROM orders WHERE id = 42").Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("status:", status)
	// Output:
	// token 7: <nil>
	// token 6: fence: stale token for orders(id=42): presented 6, current 7
	// stale; the row was written with token 7
	// status: paid
}

// A fenced transaction: any SQL inside fn is committed only if no newer
// token has been presented for the resource. A stale token is rejected
// before fn runs.
func ExampleGuard_BeginFunc() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	guard, err := sqlguard.New()
	if err != nil {
		log.Fatal(err)
	}
	ship := func(token fence.Token) error {
		return guard.BeginFunc(ctx, pool, "order/42", token, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE orders SET status = $1 WHERE id = 42", fmt.Sprint("shipped by ", token))
			return err
		})
	}

	fmt.Println("token 9:", ship(9))
	err = ship(8)
	fmt.Println("token 8:", err)
	fmt.Println("stale:", errors.Is(err, fence.ErrStaleToken), "retryable:", sqlguard.IsRetryable(err))

	var status string
	if err := pool.QueryRow(ctx, "SELECT status FROM orders WHERE id = 42").Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("status:", status)
	// Output:
	// token 9: <nil>
	// token 8: fence: stale token for order/42: presented 8, current 9
	// stale: true retryable: false
	// status: shipped by 9
}

// Advance fences a transaction you manage yourself: call it first.
func ExampleGuard_Advance() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	guard, err := sqlguard.New()
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := guard.Advance(ctx, tx, "order/42", 3); err != nil {
		log.Fatal(err) // on a stale token the transaction is aborted: roll back
	}
	if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'packed' WHERE id = 42"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("commit:", tx.Commit(ctx))
	// Output:
	// commit: <nil>
}

// Errors from the guard tell the three failures apart.
func ExampleIsRetryable() {
	classify := func(err error) string {
		switch {
		case err == nil:
			return "written"
		case errors.Is(err, fence.ErrStaleToken):
			return "stale: stop, the lease is lost"
		case sqlguard.IsRetryable(err):
			return "retry the whole transaction"
		case errors.Is(err, fence.ErrNotFound):
			return "no such row"
		default:
			return "failed"
		}
	}
	fmt.Println(classify(fence.Stale("orders(id=42)", 6, 7)))
	fmt.Println(classify(&fence.RetryableError{Op: "update", Err: errors.New("deadlock")}))
	fmt.Println(classify(fmt.Errorf("update: %w", fence.ErrNotFound)))
	// Output:
	// stale: stop, the lease is lost
	// retry the whole transaction
	// no such row
}
