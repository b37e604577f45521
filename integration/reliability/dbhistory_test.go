package reliability

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/dbguard/drivertest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/integration/internal/toxi"
)

// dbExtra maps dbguard's definite non-stale outcomes.
func dbExtra(err error) (outcome, bool) {
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

// dbEnv is one engine's database for a history check, with the pools the
// workers write through and the faults that run meanwhile.
type dbEnv struct {
	db      *drivertest.DB
	pools   []*sql.DB // the workers' pools, in turn
	vias    []string
	reader  *sql.DB
	chaos   func(ctx context.Context, r *rand.Rand, faults *faultCounter)
	dialect dbguard.Dialect
}

// newDBEnv prepares dialect's database. MariaDB: a private server (it is
// restarted during the run), reached directly and through a toxiproxy;
// the faults are killed connections (KILL CONNECTION of a random client
// of the test's pools), proxy resets and blackholes in either direction,
// and a restart of the server (SIGKILL, then start: InnoDB recovers the
// committed transactions). SQLite: a file; the faults are the short
// deadlines every run has (an interrupted statement).
func newDBEnv(t *testing.T, d dbguard.Dialect) *dbEnv {
	e := &dbEnv{dialect: d}
	if d == dbguard.SQLite {
		e.db = drivertest.OpenSQLite(t)
		e.pools = []*sql.DB{e.db.SQL, e.db.OpenWith(t, nil, nil)}
		e.vias = []string{"pool", "pool2"}
		e.reader = e.db.OpenWith(t, nil, nil)
		e.chaos = func(ctx context.Context, _ *rand.Rand, _ *faultCounter) { <-ctx.Done() }
		return e
	}
	srv := drivertest.StartServer(t)
	e.db = drivertest.OpenMySQL(t, srv.DSN)
	proxy := toxi.Start(t, fmt.Sprintf("127.0.0.1:%d", srv.Port))
	short := func(c *mysql.Config) { c.Timeout = 2 * time.Second }
	e.pools = []*sql.DB{
		e.db.OpenWith(t, short, nil),
		e.db.OpenWith(t, func(c *mysql.Config) { short(c); c.Addr = proxy.Addr }, nil),
	}
	e.vias = []string{"pool", "pool-proxy"}
	e.reader = e.db.OpenWith(t, short, nil)
	for _, p := range e.pools {
		p.SetMaxOpenConns(6)
	}
	e.chaos = func(ctx context.Context, r *rand.Rand, faults *faultCounter) {
		admin := e.db.OpenWith(t, short, nil)
		restarted := false
		for ctx.Err() == nil {
			pause := time.NewTimer(time.Duration(20+r.IntN(80)) * time.Millisecond)
			select {
			case <-ctx.Done():
				pause.Stop()
				return
			case <-pause.C:
			}
			var err error
			switch n := r.IntN(20); {
			case n == 0 && !restarted:
				// Once per run: the server dies and comes back.
				restarted = true
				faults.add("server-restart")
				srv.Restart()
			case n < 7:
				if killOne(ctx, admin, r) {
					faults.add("kill-connection")
				}
			case n < 10:
				faults.add("proxy-reset")
				err = proxy.For(ctx, time.Duration(5+r.IntN(20))*time.Millisecond, "reset_peer", "upstream", `"timeout":0`)
			case n < 14:
				faults.add("proxy-blackhole-requests")
				err = proxy.For(ctx, time.Duration(10+r.IntN(40))*time.Millisecond, "timeout", "upstream", `"timeout":0`)
			default:
				faults.add("proxy-blackhole-replies")
				err = proxy.For(ctx, time.Duration(10+r.IntN(40))*time.Millisecond, "timeout", "downstream", `"timeout":0`)
			}
			if err != nil && ctx.Err() == nil {
				t.Errorf("chaos: %v", err)
				return
			}
		}
	}
	return e
}

// killOne kills one client connection of the test's database (not the
// admin's own).
func killOne(ctx context.Context, admin *sql.DB, r *rand.Rand) bool {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := admin.QueryContext(c, `SELECT ID FROM information_schema.PROCESSLIST WHERE DB LIKE 'fk\_%' AND ID <> CONNECTION_ID() AND COMMAND <> 'Daemon'`)
	if err != nil {
		return false
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	if len(ids) == 0 {
		return false
	}
	_, err = admin.ExecContext(c, "KILL CONNECTION "+strconv.FormatInt(ids[r.IntN(len(ids))], 10))
	return err == nil
}

// runDBHistory runs workers doing op until each has done opsPerWorker,
// with the engine's faults throughout.
// A worker whose operation failed (the server restarting, no
// connection) waits 10 ms, so that an outage does not use up its
// operations.
func runDBHistory(t *testing.T, e *dbEnv, seed uint64, faults *faultCounter, op func(w int, r *rand.Rand, i int, pool *sql.DB, via string) outcome) {
	chaosCtx, stopChaos := context.WithCancel(context.Background())
	var chaosDone sync.WaitGroup
	chaosDone.Go(func() { e.chaos(chaosCtx, rand.New(rand.NewPCG(seed, 99)), faults) })
	workers := 6
	opsPerWorker := envInt("RELIABILITY_HISTORY_OPS", 150)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range opsPerWorker {
				if op(w, r, i, e.pools[w%len(e.pools)], e.vias[w%len(e.vias)]) == outFailed {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	stopChaos()
	chaosDone.Wait()
	// Statements still at the server when their clients gave up may
	// commit later: let them.
	time.Sleep(300 * time.Millisecond)
}

// TestDBTableHistoryLinearizable is TestTableHistoryLinearizable for
// dbguard.Table on MariaDB and SQLite: concurrent Update, Insert, Upsert
// and Delete (and Update in a transaction that holds the row for a while)
// on a few rows, under faults, checked against the row model.
func TestDBTableHistoryLinearizable(t *testing.T) {
	for _, d := range []dbguard.Dialect{dbguard.MySQL, dbguard.SQLite} {
		t.Run(d.String(), func(t *testing.T) {
			started := time.Now()
			seed := seedFor(t)
			e := newDBEnv(t, d)
			keyType := "VARCHAR(20)"
			lv := "lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0"
			if d == dbguard.SQLite {
				keyType, lv = "TEXT", "lock_version INTEGER NOT NULL DEFAULT 0"
			}
			e.db.Exec(t, `CREATE TABLE reg (k `+keyType+` PRIMARY KEY, v TEXT NOT NULL, `+lv+`)`)
			table, err := dbguard.NewTable(d, "", "reg", "k")
			if err != nil {
				t.Fatal(err)
			}
			const keys = 6
			h := newHistory()
			var faults faultCounter
			var tokens tokenSource
			runDBHistory(t, e, seed, &faults, func(w int, r *rand.Rand, i int, pool *sql.DB, via string) outcome {
				key := "k" + strconv.Itoa(r.IntN(keys))
				if r.IntN(10) == 0 {
					readDBRow(h, w, e.reader, key)
					return outRead
				}
				in := rowInput{Key: key, Token: tokens.next(r), Value: fmt.Sprintf("c%d-%d", w, i), Via: via}
				tok := fence.Token(in.Token)
				ctx, cancel := opContext(r, &faults)
				call := h.now()
				var out result
				switch n := r.IntN(20); {
				case n < 6:
					in.Op = opUpdate
					out = classify(table.Update(ctx, pool, []any{key}, tok, dbguard.Col("v", in.Value)), dbExtra)
				case n < 11:
					in.Op = opUpsert
					out = classify(table.Upsert(ctx, pool, []any{key}, tok, dbguard.Col("v", in.Value)), dbExtra)
				case n < 14:
					in.Op = opInsert
					out = classify(table.Insert(ctx, pool, []any{key}, tok, dbguard.Col("v", in.Value)), dbExtra)
				case n < 16:
					in.Op, in.Value = opDelete, ""
					out = classify(table.Delete(ctx, pool, []any{key}, tok), dbExtra)
				default:
					in.Op, in.Via = opUpdate, via+"-tx"
					out = dbUpdateInTx(ctx, r, pool, table, in)
				}
				cancel()
				h.add(w, in, call, out, h.now())
				return out.Outcome
			})
			for k := range keys {
				readDBRow(h, 6, e.reader, "k"+strconv.Itoa(k))
			}
			what := "dbguard.Table (" + d.String() + ")"
			h.check(t, rowModel(), what)
			f := historyFigures(what, h, &faults, started)
			f.Seed = seed
			report(t, f)
			if f.Outcomes["ok"] == 0 || f.Outcomes["stale"] == 0 || (d == dbguard.MySQL && f.Outcomes["unknown"] == 0) {
				t.Errorf("the run did not exercise every path: %+v", f)
			}
		})
	}
}

// dbUpdateInTx updates the row in a transaction that then holds it for a
// few milliseconds before committing.
func dbUpdateInTx(ctx context.Context, r *rand.Rand, pool *sql.DB, table *dbguard.Table, in rowInput) result {
	tx, err := pool.BeginTx(ctx, nil)
	if err != nil {
		return result{Outcome: outFailed, Err: err.Error()}
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: a no-op
	out := classify(table.Update(ctx, tx, []any{in.Key}, fence.Token(in.Token), dbguard.Col("v", in.Value)), dbExtra)
	if out.Outcome != outOK {
		return out
	}
	time.Sleep(time.Duration(1+r.IntN(10)) * time.Millisecond)
	return dbCommitOutcome(tx.Commit())
}

// dbCommitOutcome classifies a COMMIT the test sends itself: the
// database's answer means it did not commit; anything else is unknown.
func dbCommitOutcome(err error) result {
	if err == nil {
		return result{Outcome: outOK}
	}
	var myErr *mysql.MySQLError
	var liteErr interface{ Code() int }
	if errors.As(err, &myErr) || errors.As(err, &liteErr) || errors.Is(err, sql.ErrTxDone) {
		return result{Outcome: outFailed, Err: err.Error()}
	}
	return result{Outcome: outUnknown, Err: err.Error()}
}

func readDBRow(h *history, client int, db *sql.DB, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call := h.now()
	var v, lv string
	err := db.QueryRowContext(ctx, "SELECT v, lock_version FROM reg WHERE k = ?", key).Scan(&v, &lv)
	ret := h.now()
	out := result{Outcome: outRead}
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return
	default:
		n, err := strconv.ParseUint(lv, 10, 64)
		if err != nil {
			return
		}
		out.Exists, out.Value, out.Token = true, v, n
	}
	h.add(client, rowInput{Key: key, Op: opRead}, call, out, ret)
}

// TestDBGuardHistoryLinearizable is TestGuardHistoryLinearizable for
// dbguard.Guard.BeginFunc on MariaDB and SQLite.
func TestDBGuardHistoryLinearizable(t *testing.T) {
	for _, d := range []dbguard.Dialect{dbguard.MySQL, dbguard.SQLite} {
		t.Run(d.String(), func(t *testing.T) {
			started := time.Now()
			seed := seedFor(t)
			e := newDBEnv(t, d)
			e.db.Exec(t, `CREATE TABLE gdata (resource VARCHAR(20) PRIMARY KEY, v TEXT NOT NULL)`)
			const resources = 4
			for i := range resources {
				e.db.Exec(t, `INSERT INTO gdata VALUES (?, 'init')`, "r"+strconv.Itoa(i))
			}
			g, err := dbguard.New(d)
			if err != nil {
				t.Fatal(err)
			}
			h := newHistory()
			var faults faultCounter
			var tokens tokenSource
			runDBHistory(t, e, seed, &faults, func(w int, r *rand.Rand, i int, pool *sql.DB, via string) outcome {
				res := "r" + strconv.Itoa(r.IntN(resources))
				if r.IntN(10) == 0 {
					readDBResource(h, w, e, res)
					return outRead
				}
				in := guardInput{Resource: res, Op: opBegin, Token: tokens.next(r), Value: fmt.Sprintf("c%d-%d", w, i), Via: via}
				hold := time.Duration(0)
				if r.IntN(5) == 0 {
					hold = time.Duration(1+r.IntN(8)) * time.Millisecond
				}
				ctx, cancel := opContext(r, &faults)
				call := h.now()
				out := classify(g.BeginFunc(ctx, pool, res, fence.Token(in.Token), func(tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, "UPDATE gdata SET v = ? WHERE resource = ?", in.Value, res); err != nil {
						return err
					}
					time.Sleep(hold)
					return nil
				}), dbExtra)
				cancel()
				h.add(w, in, call, out, h.now())
				return out.Outcome
			})
			for i := range resources {
				readDBResource(h, 6, e, "r"+strconv.Itoa(i))
			}
			what := "dbguard.Guard.BeginFunc (" + d.String() + ")"
			h.check(t, guardModel("init"), what)
			f := historyFigures(what, h, &faults, started)
			f.Seed = seed
			report(t, f)
			if f.Outcomes["ok"] == 0 || f.Outcomes["stale"] == 0 || (d == dbguard.MySQL && f.Outcomes["unknown"] == 0) {
				t.Errorf("the run did not exercise every path: %+v", f)
			}
		})
	}
}

func readDBResource(h *history, client int, e *dbEnv, res string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call := h.now()
	var v, tok string
	var key any = res
	if e.dialect == dbguard.MySQL {
		key = []byte(res)
	}
	err := e.reader.QueryRowContext(ctx, `SELECT g.v, COALESCE((SELECT t.token FROM fencekit_resource_tokens t WHERE t.resource = ?), 0)
		FROM gdata g WHERE g.resource = ?`, key, res).Scan(&v, &tok)
	ret := h.now()
	if err != nil {
		return
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return
	}
	h.add(client, guardInput{Resource: res, Op: opRead}, call, result{Outcome: outRead, Token: n, Value: v}, ret)
}
