package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseprom"
)

// The job, and what it fences. The lease name and both resources come from
// one constant, spelled in the code, the same on every replica: a resource
// names what is protected and the job that writes it, never Lease.Name(),
// so that a replica configured with a mistyped lease name would still meet
// the others in one order of tokens at each store
// (docs/fencing-over-http.md, "Naming the resource").
const (
	job               = "settle-orders"
	ordersResource    = "orders/" + job    // dbguard.Guard.BeginFunc, in MariaDB
	inventoryResource = "inventory/" + job // the Fencing-Token field's resource, at the service
)

// replicaConfig is what the orchestrator hands a replica process (as JSON
// in the environment variable configVar, see demo.StartChild).
type replicaConfig struct {
	Name         string          `json:"name"`
	Leases       demo.LeaseStore `json:"leases"`
	TTL          time.Duration   `json:"ttl"`
	MySQLDSN     string          `json:"mysql_dsn"`
	InventoryURL string          `json:"inventory_url"`
	Period       string          `json:"period"`
	OrderTime    time.Duration   `json:"order_time"`
	// StopAfter are the orders after which the replica that settles
	// them stops until SIGCONT (see stopPoint): --freeze-after, where the
	// orchestrator freezes the holder, and the next order, where it reads
	// the metrics while the next holder runs the job, and again once the
	// frozen one runs again.
	StopAfter []int `json:"stop_after"`
	// Budget bounds the replica's whole run: the wait for the lease, the
	// job, the waits at the stop points.
	Budget time.Duration `json:"budget"`
}

const configVar = "FENCEKIT_SETTLEORDERS_REPLICA"

// event is one line a replica prints on its standard output.
type event struct {
	At      time.Time   `json:"at"`
	Replica string      `json:"replica"`
	Kind    string      `json:"kind"`
	Token   fence.Token `json:"token,omitempty"`
	// Order is the order of an evOrder event (0 for the run's closing
	// transaction) and of an evStopPoint.
	Order int `json:"order,omitempty"`
	// Writes are an evOrder's writes: the inventory call, then the
	// MariaDB transaction.
	Writes []write `json:"writes,omitempty"`
	// MetricsURL is, on evReady, where the replica serves /metrics.
	MetricsURL string `json:"metrics_url,omitempty"`
	// Ran and Error are RunOnce's results, on evRunEnded.
	Ran   bool   `json:"ran,omitempty"`
	Error string `json:"error,omitempty"`
	Text  string `json:"text"`
}

// write is one write of the job: a call to the inventory service or a
// fenced MariaDB transaction.
type write struct {
	Store   string      `json:"store"` // storeInventory or storeMariaDB
	Token   fence.Token `json:"token"`
	Outcome string      `json:"outcome"` // outcomeAccepted, outcomeStale, outcomeFailed
	// Current is, for a write refused as stale, the newer token the store
	// had accepted.
	Current fence.Token `json:"current,omitempty"`
	Error   string      `json:"error,omitempty"`
	// Late says the writer's lease had ended when the write was sent
	// (Lease.Err was not nil): this process no longer held it.
	Late bool `json:"late,omitempty"`
}

const (
	evReady     = "ready"  // start-up checks passed; /metrics is served
	evFailed    = "failed" // the replica cannot go on (Text says why)
	evStarted   = "started"
	evOrder     = "order"
	evStopPoint = "stop-point" // stopped after Order until SIGCONT
	evLost      = "lost"       // noticed its lease ended without a release
	evRunEnded  = "run-ended"  // RunOnce returned (Ran, Error)

	storeInventory = "inventory"
	storeMariaDB   = "mariadb"

	outcomeAccepted = "accepted"
	outcomeStale    = "stale"
	outcomeFailed   = "failed"
)

// replica is one replica process of the job.
type replica struct {
	cfg    replicaConfig
	out    *demo.Reporter
	db     *sql.DB
	guard  *dbguard.Guard
	orders *dbguard.Table
	ledger *dbguard.Ledger
	client *http.Client
	cont   chan os.Signal // SIGCONT, for the stop points
}

func (r *replica) emit(e event) {
	e.At, e.Replica = time.Now(), r.cfg.Name
	r.out.Report(e)
}

func (r *replica) fail(format string, args ...any) int {
	r.emit(event{Kind: evFailed, Text: fmt.Sprintf(format, args...)})
	return 1
}

// runReplica is the body of a replica process: what a service running the
// nightly job does at start-up and at night.
func runReplica() int {
	r := &replica{out: demo.NewReporter(os.Stdout), cont: make(chan os.Signal, 1)}
	if err := demo.ReadChildConfig(configVar, &r.cfg); err != nil {
		fmt.Fprintf(os.Stderr, "settleorders replica: %v\n", err)
		return 2
	}
	signal.Notify(r.cont, syscall.SIGCONT)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Budget)
	defer cancel()

	// Metrics for the operations team: one leaseprom Observer takes the
	// lease events (the job gauge among them) and every guard's writes.
	reg := prometheus.NewRegistry()
	obs, err := leaseprom.New(reg)
	if err != nil {
		return r.fail("metrics: %v", err)
	}
	metricsURL, stopMetrics, err := serveMetrics(reg)
	if err != nil {
		return r.fail("metrics: %v", err)
	}
	defer stopMetrics()

	m, closeLeases, err := demo.NewLeaseManager(r.cfg.Leases, r.cfg.TTL, lease.WithIdentity(r.cfg.Name), lease.WithObserver(obs))
	if err != nil {
		return r.fail("%v", err)
	}
	defer closeLeases()
	if r.db, err = sql.Open("mysql", r.cfg.MySQLDSN); err != nil {
		return r.fail("MariaDB: %v", err)
	}
	defer r.db.Close()
	if err := r.newGuards(obs); err != nil {
		return r.fail("%v", err)
	}
	r.client = &http.Client{Transport: &fencehttp.Transport{Require: true, Timeout: 10 * time.Second, Observer: obs}}

	// At start-up, not at night: every store the job needs answers and is
	// set up for it. Each problem is a *fence.SetupError (lease.ErrSetup)
	// that names its fix.
	if err := r.checkSetup(ctx, m); err != nil {
		return r.fail("start-up check: %v", err)
	}
	r.emit(event{Kind: evReady, MetricsURL: metricsURL,
		Text: "start-up checks passed (Redis leases, the resource table, orders, the ledger); metrics at " + metricsURL})

	ran, err := m.RunOnce(ctx, job, r.cfg.Period, r.ledger, r.settle)
	e := event{Kind: evRunEnded, Ran: ran}
	switch {
	case err != nil:
		e.Error, e.Text = err.Error(), fmt.Sprintf("RunOnce for %s returned (ran=%v): %s", r.cfg.Period, ran, firstLine(err.Error(), 160))
	case ran:
		e.Text = fmt.Sprintf("RunOnce: ran the job for %s and marked it done", r.cfg.Period)
	default:
		e.Text = fmt.Sprintf("RunOnce: the ledger says the run for %s is done; nothing to do", r.cfg.Period)
	}
	r.emit(e)

	// A service keeps running (and serving /metrics) after its nightly
	// job: the orchestrator reads the metrics, then ends it.
	select {
	case <-term:
	case <-ctx.Done():
	}
	return 0
}

// newGuards makes the job's guards, each reporting its writes to obs.
func (r *replica) newGuards(obs fence.WriteObserver) error {
	var err error
	if r.guard, err = dbguard.New(dbguard.MySQL, dbguard.WithObserver(obs)); err != nil {
		return err
	}
	if r.orders, err = dbguard.NewTable(dbguard.MySQL, "", "orders", "id"); err != nil {
		return err
	}
	r.orders = r.orders.WithObserver(obs)
	r.ledger, err = dbguard.NewLedger(dbguard.MySQL, r.db, "", dbguard.LedgerTable)
	return err
}

// checkSetup runs every start-up check the job's stores have.
func (r *replica) checkSetup(ctx context.Context, m *lease.Manager) error {
	return errors.Join(
		m.Check(ctx),
		r.guard.Check(ctx, r.db),
		r.orders.Check(ctx, r.db),
		r.ledger.Check(ctx),
	)
}

// serveMetrics serves reg's metrics at /metrics on a loopback port.
func serveMetrics(reg *prometheus.Registry) (url string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return "http://" + lis.Addr().String() + "/metrics", func() { _ = srv.Close() }, nil
}

// openOrder is an order the job settles.
type openOrder struct {
	ID     int
	Amount int64
}

// settle is the nightly job, run under the lease by RunOnce: for each open
// order, release its reserved stock at the inventory service, then settle
// it in MariaDB; then close the night's run, recording it done in the
// same transaction.
//
// Its writes use a context of their own, not the lease's, as a write
// already under way would: a holder cannot tell that it was paused, and
// the fence, not the context, is what refuses a write that comes too
// late. And it does not stop at a refusal: it goes on with its list, as a
// job that looks at its errors only at the end would, so that every write
// a paused holder makes after its lease ran out reaches a store and is
// seen refused. (A job should stop at the first fence.ErrStaleToken: the
// next holder has the run. Fencing keeps the stores safe either way.) Any
// other failure stops the run, leaving the order open for the next run.
func (r *replica) settle(ctx context.Context, l *lease.Lease) error {
	tok := l.Token()
	r.emit(event{Kind: evStarted, Token: tok, Text: fmt.Sprintf("holds lease %q with fencing token %d: runs the job for %s", job, tok, r.cfg.Period)})
	r.watchLoss(l)
	open, err := r.openOrders(ctx)
	if err != nil {
		return err
	}
	var refused []error
	settled := 0
	for _, o := range open {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		call := r.releaseStock(wctx, l, o)
		var tx write
		if call.Outcome != outcomeFailed {
			tx = r.settleOrder(wctx, l, o)
		}
		cancel()
		r.reportOrder(o.ID, call, tx)
		if call.Outcome == outcomeFailed || tx.Outcome == outcomeFailed {
			return fmt.Errorf("order %d: %s", o.ID, errors.Join(errIf(call.Error), errIf(tx.Error)))
		}
		if call.Outcome == outcomeStale || tx.Outcome == outcomeStale {
			refused = append(refused, fmt.Errorf("order %d: refused as stale", o.ID))
		} else {
			settled++
		}
		if slices.Contains(r.cfg.StopAfter, o.ID) {
			if err := r.stopPoint(o.ID, tok); err != nil {
				return err
			}
		}
		time.Sleep(r.cfg.OrderTime)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	closing := r.closeRun(wctx, l, settled)
	r.reportOrder(0, write{}, closing)
	if closing.Outcome != outcomeAccepted {
		refused = append(refused, fmt.Errorf("closing the run: %s", closing.Error))
	}
	return errors.Join(refused...)
}

func errIf(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}

// openOrders lists the orders no run has settled yet.
func (r *replica) openOrders(ctx context.Context) ([]openOrder, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT id, amount_cents FROM orders WHERE status = 'open' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("reading the open orders: %w", err)
	}
	defer rows.Close()
	var open []openOrder
	for rows.Next() {
		var o openOrder
		if err := rows.Scan(&o.ID, &o.Amount); err != nil {
			return nil, err
		}
		open = append(open, o)
	}
	return open, rows.Err()
}

// releaseStock asks the inventory service to release the order's reserved
// stock, with the lease's token in the Fencing-Token field.
func (r *replica) releaseStock(ctx context.Context, l *lease.Lease, o openOrder) write {
	w := r.begin(storeInventory, l)
	ctx = fencewire.NewContext(ctx, fencewire.Value{Resource: inventoryResource, Token: w.Token})
	body, _ := json.Marshal(map[string]string{"replica": r.cfg.Name})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.InventoryURL+"/orders/"+strconv.Itoa(o.ID)+"/release", strings.NewReader(string(body)))
	if err == nil {
		var resp *http.Response
		if resp, err = r.client.Do(req); err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("inventory: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
			}
		}
	}
	return finish(w, err)
}

// settleOrder settles the order in one transaction fenced on the job's
// resource (dbguard.Guard.BeginFunc): the order's row, through the fenced
// table (its lock_version), and its payout. An order some run settled
// already is left as it is.
func (r *replica) settleOrder(ctx context.Context, l *lease.Lease, o openOrder) write {
	w := r.begin(storeMariaDB, l)
	err := r.guard.BeginFunc(ctx, r.db, ordersResource, w.Token, func(tx *sql.Tx) error {
		var status string
		if err := tx.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = ? FOR UPDATE`, o.ID).Scan(&status); err != nil {
			return err
		}
		if status == "settled" {
			return nil
		}
		if err := r.orders.Update(ctx, tx, []any{o.ID}, w.Token,
			dbguard.Col("status", "settled"), dbguard.Col("settled_by", r.cfg.Name), dbguard.Col("settled_token", uint64(w.Token))); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO payouts (order_id, amount_cents, replica, token) VALUES (?, ?, ?, ?)`,
			o.ID, o.Amount, r.cfg.Name, uint64(w.Token))
		return err
	})
	return finish(w, err)
}

// closeRun records the night's run in one fenced transaction with the
// ledger's done mark (dbguard.Ledger.MarkDoneTx): the record and the mark
// commit together, and RunOnce then finds the run done by this token.
func (r *replica) closeRun(ctx context.Context, l *lease.Lease, settled int) write {
	w := r.begin(storeMariaDB, l)
	err := r.guard.BeginFunc(ctx, r.db, ordersResource, w.Token, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO settlement_runs (period, replica, token, orders_settled) VALUES (?, ?, ?, ?)`,
			r.cfg.Period, r.cfg.Name, uint64(w.Token), settled); err != nil {
			return err
		}
		return r.ledger.MarkDoneTx(ctx, tx, job, r.cfg.Period, w.Token)
	})
	return finish(w, err)
}

// begin starts the record of a write to store, sent now with l's token.
func (r *replica) begin(store string, l *lease.Lease) write {
	return write{Store: store, Token: l.Token(), Late: l.Err() != nil}
}

// finish completes w with the store's answer err.
func finish(w write, err error) write {
	switch se, stale := fence.AsStale(err); {
	case err == nil:
		w.Outcome = outcomeAccepted
	case stale:
		w.Outcome, w.Current = outcomeStale, se.Current
	default:
		w.Outcome, w.Error = outcomeFailed, err.Error()
	}
	return w
}

// reportOrder emits the writes of one order (0: the run's closing
// transaction, call is then empty).
func (r *replica) reportOrder(id int, call, tx write) {
	var writes []write
	var parts []string
	for _, w := range []write{call, tx} {
		if w.Store == "" {
			continue
		}
		writes = append(writes, w)
		parts = append(parts, describe(w))
	}
	what := fmt.Sprintf("order %d", id)
	if id == 0 {
		what = "closing the run (record + ledger's done mark)"
	}
	late := ""
	if len(writes) > 0 && writes[0].Late {
		late = " [its lease had ended]"
	}
	r.emit(event{Kind: evOrder, Order: id, Token: writes[0].Token, Writes: writes, Text: what + late + ": " + strings.Join(parts, "; ")})
}

func describe(w write) string {
	name := map[string]string{storeInventory: "inventory call", storeMariaDB: "MariaDB transaction"}[w.Store]
	switch w.Outcome {
	case outcomeAccepted:
		return name + " accepted"
	case outcomeStale:
		return fmt.Sprintf("%s REFUSED: stale token %d, the store has token %d", name, w.Token, w.Current)
	}
	return fmt.Sprintf("%s FAILED: %s", name, firstLine(w.Error, 120))
}

// stopPoint stops the job after order id until the process gets SIGCONT.
// It is the demo's, not the job's: it lets the orchestrator freeze the
// holder with SIGSTOP between two orders, never inside a transaction (a
// frozen transaction would hold its row locks through the pause), and read
// the metrics at set points of the story, whatever the machine's load.
// The job itself does not know it was frozen: it goes on with the next
// order as if nothing happened.
func (r *replica) stopPoint(id int, tok fence.Token) error {
	for len(r.cont) > 0 {
		<-r.cont // a SIGCONT from before
	}
	r.emit(event{Kind: evStopPoint, Order: id, Token: tok, Text: fmt.Sprintf("done with order %d", id)})
	select {
	case <-r.cont:
		return nil
	case <-time.After(r.cfg.Budget):
		return fmt.Errorf("never let go after order %d", id)
	}
}

// watchLoss reports the moment this process notices that l ended without
// a release (a frozen process notices only once it runs again). The
// watcher ends with l, which RunOnce releases before it returns.
func (r *replica) watchLoss(l *lease.Lease) {
	go func() {
		<-l.Done()
		if err := l.Err(); errors.Is(err, lease.ErrLost) {
			r.emit(event{Kind: evLost, Token: l.Token(), Text: fmt.Sprintf("noticed its lease is lost: %v", err)})
		}
	}()
}

// firstLine returns s up to its first newline, cut to n bytes.
func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
