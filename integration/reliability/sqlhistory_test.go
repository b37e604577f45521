package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/integration/internal/toxi"
	"github.com/fencekit/fencekit/sqlguard"
)

// envInt reads a positive integer from the environment, or returns def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// seedFor returns the run's random seed: RELIABILITY_SEED, or a fixed
// default so that CI runs are the same each time. It is logged so that a
// failure can be replayed.
func seedFor(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(20260513)
	if v := os.Getenv("RELIABILITY_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("RELIABILITY_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (replay with RELIABILITY_SEED=%d)", seed, seed)
	return seed
}

// opContext returns the context of one operation: usually a generous
// deadline, in 3 operations of 10 one of 0.5 to 15.5 ms, which often
// fires while the request is in flight (or blocked on a row lock). The
// returned function ends the context and counts, as faults, the short
// deadlines set and those that expired before the operation returned.
func opContext(r *rand.Rand, faults *faultCounter) (context.Context, func()) {
	if r.IntN(10) < 3 {
		faults.add("short-deadline")
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(500+r.IntN(15000))*time.Microsecond)
		return ctx, func() {
			if ctx.Err() != nil {
				faults.add("deadline-expired")
			}
			cancel()
		}
	}
	return context.WithTimeout(context.Background(), 3*time.Second)
}

// pgChaos injects faults into PostgreSQL connections until ctx ends: it
// kills a random backend of the test's connections (pg_terminate_backend),
// resets every connection through the proxy, or blackholes the proxy in
// one direction for a while (requests lost, or replies lost after the
// server acted).
func pgChaos(ctx context.Context, t *testing.T, e *pgEnv, proxy *toxi.Proxy, r *rand.Rand, faults *faultCounter) {
	admin := e.conn(ctx, "")
	defer admin.Close(context.Background())
	for ctx.Err() == nil {
		pause := time.NewTimer(time.Duration(20+r.IntN(80)) * time.Millisecond)
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
		var err error
		switch r.IntN(4) {
		case 0:
			if e.terminateOne(ctx, admin) {
				faults.add("pg_terminate_backend")
			}
		case 1:
			faults.add("proxy-reset")
			err = proxy.For(ctx, time.Duration(5+r.IntN(20))*time.Millisecond, "reset_peer", "upstream", `"timeout":0`)
		case 2:
			faults.add("proxy-blackhole-requests")
			err = proxy.For(ctx, time.Duration(10+r.IntN(40))*time.Millisecond, "timeout", "upstream", `"timeout":0`)
		case 3:
			faults.add("proxy-blackhole-replies")
			err = proxy.For(ctx, time.Duration(10+r.IntN(40))*time.Millisecond, "timeout", "downstream", `"timeout":0`)
		}
		if err != nil && ctx.Err() == nil {
			t.Errorf("chaos: %v", err)
			return
		}
	}
}

// sqlExtra maps sqlguard's definite non-stale outcomes.
func sqlExtra(err error) (outcome, bool) {
	switch {
	case errors.Is(err, fence.ErrNotFound):
		return outNotFound, true
	case errors.Is(err, fence.ErrExists):
		return outExists, true
	case errors.Is(err, fence.ErrRetryable):
		return outNoChange, true
	}
	return 0, false
}

// commitOutcome classifies the error of a COMMIT the test sends itself: an
// answer from the server (or pgx's word that nothing was sent) means the
// transaction did not commit; anything else leaves it unknown.
func commitOutcome(err error) result {
	if err == nil {
		return result{Outcome: outOK}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return result{Outcome: outFailed, Err: err.Error()}
	}
	return result{Outcome: outUnknown, Err: err.Error()}
}

// TestTableHistoryLinearizable runs concurrent sqlguard.Table writes
// (Update, Insert, Upsert, Delete, and Update inside a transaction that
// holds the row lock for a while) on a few rows from two pools, one direct
// and one through a fault proxy, with faults injected throughout, records
// every operation and checks the history against the row model.
func TestTableHistoryLinearizable(t *testing.T) {
	started := time.Now()
	seed := seedFor(t)
	e := newPGEnv(t)
	e.exec(`CREATE TABLE reg (k text PRIMARY KEY, v text NOT NULL,
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`)
	table, err := sqlguard.NewTable("", "reg", "k")
	if err != nil {
		t.Fatal(err)
	}
	proxy := toxi.Start(t, pgUpstream(t))
	direct := e.pool("", 6)
	proxied := e.pool(proxy.Addr, 6)
	reader := e.pool("", 2)

	const keys = 6
	workers := 6
	opsPerWorker := envInt("RELIABILITY_HISTORY_OPS", 150)
	h := newHistory()
	var faults faultCounter
	var tokens tokenSource

	chaosCtx, stopChaos := context.WithCancel(context.Background())
	var chaosDone sync.WaitGroup
	chaosDone.Add(1)
	go func() {
		defer chaosDone.Done()
		pgChaos(chaosCtx, t, e, proxy, rand.New(rand.NewPCG(seed, 99)), &faults)
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			pool, via := direct, "pool"
			if w%2 == 1 {
				pool, via = proxied, "pool-proxy"
			}
			for i := range opsPerWorker {
				key := "k" + strconv.Itoa(r.IntN(keys))
				if r.IntN(10) == 0 {
					readRow(h, w, reader, key)
					continue
				}
				in := rowInput{Key: key, Token: tokens.next(r), Value: fmt.Sprintf("c%d-%d", w, i), Via: via}
				ctx, cancel := opContext(r, &faults)
				call := h.now()
				var out result
				switch n := r.IntN(20); {
				case n < 6:
					in.Op = opUpdate
					out = classify(table.Update(ctx, pool, []any{key}, fence.Token(in.Token), sqlguard.Col("v", in.Value)), sqlExtra)
				case n < 11:
					in.Op = opUpsert
					out = classify(table.Upsert(ctx, pool, []any{key}, fence.Token(in.Token), sqlguard.Col("v", in.Value)), sqlExtra)
				case n < 14:
					in.Op = opInsert
					out = classify(table.Insert(ctx, pool, []any{key}, fence.Token(in.Token), sqlguard.Col("v", in.Value)), sqlExtra)
				case n < 16:
					in.Op = opDelete
					in.Value = ""
					out = classify(table.Delete(ctx, pool, []any{key}, fence.Token(in.Token)), sqlExtra)
				default:
					in.Op, in.Via = opUpdate, via+"-tx"
					out = updateInTx(ctx, r, pool, table, in)
				}
				cancel()
				h.add(w, in, call, out, h.now())
			}
		}()
	}
	wg.Wait()
	stopChaos()
	chaosDone.Wait()
	// Statements still blocked at the server when their clients gave up
	// may commit later: let them, then read every row once more.
	time.Sleep(200 * time.Millisecond)
	for k := range keys {
		readRow(h, workers, reader, "k"+strconv.Itoa(k))
	}

	h.check(t, rowModel(), "sqlguard.Table")
	f := historyFigures("sqlguard.Table", h, &faults, started)
	f.Seed = seed
	report(t, f)
	if f.Outcomes["ok"] == 0 || f.Outcomes["stale"] == 0 || f.Outcomes["unknown"] == 0 || faults.total() == 0 {
		t.Errorf("the run did not exercise every path: %+v", f)
	}
}

// updateInTx updates the row inside a transaction on pool that holds the
// row lock for a few milliseconds before it commits, so that other writers
// of the row block (and their deadlines fire while they wait).
func updateInTx(ctx context.Context, r *rand.Rand, pool *pgxpool.Pool, table *sqlguard.Table, in rowInput) result {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return result{Outcome: outFailed, Err: err.Error()}
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	out := classify(table.Update(ctx, tx, []any{in.Key}, fence.Token(in.Token), sqlguard.Col("v", in.Value)), sqlExtra)
	if out.Outcome != outOK {
		return out
	}
	time.Sleep(time.Duration(1+r.IntN(10)) * time.Millisecond)
	return commitOutcome(tx.Commit(ctx))
}

// readRow records a read of one row (a read that fails tells nothing and
// is not recorded).
func readRow(h *history, client int, pool *pgxpool.Pool, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call := h.now()
	var v string
	var lv int64
	err := pool.QueryRow(ctx, "SELECT v, lock_version FROM reg WHERE k = $1", key).Scan(&v, &lv)
	ret := h.now()
	out := result{Outcome: outRead}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return
	default:
		out.Exists, out.Value, out.Token = true, v, uint64(lv)
	}
	h.add(client, rowInput{Key: key, Op: opRead}, call, out, ret)
}

// TestGuardHistoryLinearizable runs concurrent sqlguard.Guard.BeginFunc
// transactions, each setting a resource's data, through two pools (one
// through a fault proxy), through dedicated connections and through a
// savepoint of a transaction the test commits itself, with faults injected
// throughout, and checks the history against the guarded-register model:
// a resource's data is that of the transaction with the newest token that
// committed.
func TestGuardHistoryLinearizable(t *testing.T) {
	started := time.Now()
	seed := seedFor(t)
	e := newPGEnv(t)
	e.exec(`CREATE TABLE gdata (resource text PRIMARY KEY, v text NOT NULL)`)
	const resources = 4
	for i := range resources {
		e.exec(`INSERT INTO gdata VALUES ($1, 'init')`, "r"+strconv.Itoa(i))
	}
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	proxy := toxi.Start(t, pgUpstream(t))
	direct := e.pool("", 6)
	proxied := e.pool(proxy.Addr, 6)
	reader := e.pool("", 2)

	workers := 6
	opsPerWorker := envInt("RELIABILITY_HISTORY_OPS", 150)
	h := newHistory()
	var faults faultCounter
	var tokens tokenSource

	chaosCtx, stopChaos := context.WithCancel(context.Background())
	var chaosDone sync.WaitGroup
	chaosDone.Add(1)
	go func() {
		defer chaosDone.Done()
		pgChaos(chaosCtx, t, e, proxy, rand.New(rand.NewPCG(seed, 99)), &faults)
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			addr, pool, via := "", direct, "pool"
			if w%2 == 1 {
				addr, pool, via = proxy.Addr, proxied, "pool-proxy"
			}
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for i := range opsPerWorker {
				res := "r" + strconv.Itoa(r.IntN(resources))
				if r.IntN(10) == 0 {
					readResource(h, w, reader, res)
					continue
				}
				in := guardInput{Resource: res, Op: opBegin, Token: tokens.next(r), Value: fmt.Sprintf("c%d-%d", w, i)}
				hold := time.Duration(0)
				if r.IntN(5) == 0 {
					hold = time.Duration(1+r.IntN(8)) * time.Millisecond
				}
				fn := func(tx pgx.Tx) error {
					if _, err := tx.Exec(context.Background(), "UPDATE gdata SET v = $2 WHERE resource = $1", res, in.Value); err != nil {
						return err
					}
					time.Sleep(hold)
					return nil
				}
				mode := r.IntN(3)
				if mode > 0 && (conn == nil || conn.IsClosed()) {
					if conn != nil {
						conn.Close(context.Background())
					}
					cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					c, err := pgx.ConnectConfig(cctx, e.config(addr))
					cancel()
					if err != nil {
						conn = nil
						continue // no connection: nothing to record
					}
					conn = c
				}
				ctx, cancel := opContext(r, &faults)
				call := h.now()
				var out result
				switch mode {
				case 0:
					in.Via = via
					out = classify(g.BeginFunc(ctx, pool, res, fence.Token(in.Token), fn), sqlExtra)
				case 1:
					in.Via = via + "-conn"
					out = classify(g.BeginFunc(ctx, conn, res, fence.Token(in.Token), fn), sqlExtra)
				case 2:
					in.Via = via + "-savepoint"
					out = beginInSavepoint(ctx, g, conn, res, in.Token, fn)
				}
				cancel()
				h.add(w, in, call, out, h.now())
			}
		}()
	}
	wg.Wait()
	stopChaos()
	chaosDone.Wait()
	time.Sleep(200 * time.Millisecond)
	for i := range resources {
		readResource(h, workers, reader, "r"+strconv.Itoa(i))
	}

	h.check(t, guardModel("init"), "sqlguard.Guard.BeginFunc")
	f := historyFigures("sqlguard.Guard.BeginFunc", h, &faults, started)
	f.Seed = seed
	report(t, f)
	if f.Outcomes["ok"] == 0 || f.Outcomes["stale"] == 0 || f.Outcomes["unknown"] == 0 {
		t.Errorf("the run did not exercise every path: %+v", f)
	}
}

// beginInSavepoint runs the fenced transaction as a savepoint of a
// transaction on conn, which the test then commits: the outer COMMIT is
// what makes it take effect.
func beginInSavepoint(ctx context.Context, g *sqlguard.Guard, conn *pgx.Conn, res string, token uint64, fn func(pgx.Tx) error) result {
	outer, err := conn.Begin(ctx)
	if err != nil {
		return result{Outcome: outFailed, Err: err.Error()}
	}
	defer outer.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	if out := classify(g.BeginFunc(ctx, outer, res, fence.Token(token), fn), sqlExtra); out.Outcome != outOK {
		return out
	}
	return commitOutcome(outer.Commit(ctx))
}

func readResource(h *history, client int, pool *pgxpool.Pool, res string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call := h.now()
	var v string
	var tok int64
	err := pool.QueryRow(ctx, `SELECT g.v, coalesce(t.token, 0) FROM gdata g
		LEFT JOIN fencekit_resource_tokens t ON t.resource = g.resource WHERE g.resource = $1`, res).Scan(&v, &tok)
	ret := h.now()
	if err != nil {
		return
	}
	h.add(client, guardInput{Resource: res, Op: opRead}, call, result{Outcome: outRead, Token: uint64(tok), Value: v}, ret)
}
