package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
)

// summary is the run's outcome: what the program prints, and writes with
// --json.
type summary struct {
	OK      bool   `json:"ok"`
	Verdict string `json:"verdict"`

	Job         string   `json:"job"`
	Period      string   `json:"period"`
	Orders      int      `json:"orders"`
	FreezeAfter int      `json:"freeze_after"`
	Replicas    int      `json:"replicas"`
	Database    string   `json:"database"`
	RedisPrefix string   `json:"redis_prefix"`
	LeaseKeys   []string `json:"lease_keys"`

	// Frozen is the replica frozen at its freeze point, with the token of
	// the lease it held; CompletedBy the one whose RunOnce completed the
	// night's run.
	Frozen         string      `json:"frozen"`
	FrozenToken    fence.Token `json:"frozen_token"`
	CompletedBy    string      `json:"completed_by"`
	CompletedToken fence.Token `json:"completed_token"`
	// LateWrites are the writes sent after the writer's lease had ended.
	LateWrites []lateWrite `json:"late_writes"`

	Stores           stores   `json:"stores"`
	Samples          []sample `json:"metrics"`
	InventoryMetrics metrics  `json:"inventory_metrics"`
	Checks           []check  `json:"checks"`
	Events           []event  `json:"events"`

	Services []string      `json:"services"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// lateWrite is a write sent after its writer's lease had ended.
type lateWrite struct {
	Replica string `json:"replica"`
	Order   int    `json:"order"` // 0: the run's closing transaction
	write
}

// stores is what the stores hold after the night, read by the program
// itself.
type stores struct {
	OpenOrders int            `json:"open_orders"`
	SettledBy  map[string]int `json:"settled_by"`
	Payouts    int            `json:"payouts"`
	// NotPaidOnce lists the orders with no payout or more than one.
	NotPaidOnce []int `json:"not_paid_once"`
	PayoutCents int64 `json:"payout_cents"`
	OrderCents  int64 `json:"order_cents"`
	// Runs counts the night's rows in settlement_runs.
	Runs       int  `json:"runs"`
	LedgerDone bool `json:"ledger_done"`
	// Released is the inventory service's record: each order's release.
	Released map[int]release `json:"released"`
	Repeats  int             `json:"repeated_releases"`
}

// check is one line of the verdict.
type check struct {
	OK   bool   `json:"ok"`
	Text string `json:"text"`
}

// The kinds of samples, by the moment they were taken.
const (
	sampleBeforeFreeze = "before-freeze"
	sampleFrozen       = "frozen"
	sampleAfterResume  = "after-resume"
	sampleFinal        = "final"
)

// conclude reads the stores and the inventory service's metrics, and
// judges the run.
func (f *follower) conclude() (*summary, error) {
	sum := f.sum
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if err := f.sc.readStores(ctx, f.o.period, &sum.Stores); err != nil {
		return nil, fmt.Errorf("reading the stores: %w", err)
	}
	_, sum.Stores.Released, sum.Stores.Repeats = f.sc.inv.state()
	mfs, err := f.sc.inv.reg.Gather()
	if err != nil {
		return nil, err
	}
	sum.InventoryMetrics = read(mfs)
	sum.judge()
	return sum, nil
}

// readStores reads the night's outcome from MariaDB.
func (sc *scenario) readStores(ctx context.Context, period string, st *stores) error {
	db, err := sql.Open("mysql", sc.db.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	st.SettledBy = map[string]int{}
	rows, err := db.QueryContext(ctx, `SELECT o.id, o.status, COALESCE(o.settled_by, ''), o.amount_cents,
		(SELECT COUNT(*) FROM payouts p WHERE p.order_id = o.id), (SELECT COALESCE(SUM(p.amount_cents), 0) FROM payouts p WHERE p.order_id = o.id)
		FROM orders o ORDER BY o.id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, payouts         int
			status, by          string
			amount, payoutCents int64
		)
		if err := rows.Scan(&id, &status, &by, &amount, &payouts, &payoutCents); err != nil {
			return err
		}
		if status != "settled" {
			st.OpenOrders++
		} else {
			st.SettledBy[by]++
		}
		if payouts != 1 {
			st.NotPaidOnce = append(st.NotPaidOnce, id)
		}
		st.Payouts += payouts
		st.PayoutCents += payoutCents
		st.OrderCents += amount
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM settlement_runs WHERE period = ?`, period).Scan(&st.Runs); err != nil {
		return err
	}
	err = db.QueryRowContext(ctx, `SELECT done_at IS NOT NULL FROM `+dbguard.LedgerTable+` WHERE job = ? AND run_key = ?`, job, period).Scan(&st.LedgerDone)
	if err == sql.ErrNoRows {
		return nil
	}
	return err
}

// judge fills in the checks, OK and the verdict from what the run
// recorded (events, samples, stores).
func (s *summary) judge() {
	var (
		ready    = map[string]bool{}
		started  = map[string]fence.Token{}
		ends     = map[string]event{}
		refused  = map[string]int{} // the frozen replica's refusals, by store
		outcomes = map[string]int{} // of all late writes
	)
	s.LateWrites = nil
	for _, e := range s.Events {
		switch e.Kind {
		case evReady:
			ready[e.Replica] = true
		case evStarted:
			started[e.Replica] = e.Token
		case evRunEnded:
			ends[e.Replica] = e
		case evOrder:
			for _, w := range e.Writes {
				if w.Late {
					s.LateWrites = append(s.LateWrites, lateWrite{Replica: e.Replica, Order: e.Order, write: w})
					outcomes[w.Outcome]++
				}
				if e.Replica == s.Frozen && w.Outcome == outcomeStale {
					refused[w.Store]++
				}
			}
		}
	}
	var checks []check
	add := func(ok bool, format string, args ...any) {
		checks = append(checks, check{ok, fmt.Sprintf(format, args...)})
	}

	add(len(ready) == s.Replicas, "start-up checks (Manager.Check, Guard.Check, Table.Check, Ledger.Check) passed on %d of %d replicas", len(ready), s.Replicas)

	// Once a night: one RunOnce completed the run; every other one found
	// it done, or is the frozen holder's, refused.
	var completed, foundDone, other []string
	for _, name := range slices.Sorted(maps.Keys(ends)) {
		switch e := ends[name]; {
		case e.Ran && e.Error == "":
			completed = append(completed, name)
		case !e.Ran && e.Error == "":
			foundDone = append(foundDone, name)
		case name != s.Frozen:
			other = append(other, name+": "+firstLine(e.Error, 100))
		}
	}
	if len(completed) == 1 {
		s.CompletedBy, s.CompletedToken = completed[0], started[completed[0]]
	}
	frozenEnd, frozenEnded := ends[s.Frozen]
	add(len(completed) == 1 && len(other) == 0 && len(ends) == s.Replicas && s.Stores.LedgerDone && s.Stores.Runs == 1 &&
		(s.Frozen == "" || (frozenEnded && frozenEnd.Error != "")),
		"the night's run completed once: by %s (token %d); found done by %s; the frozen %s's run refused; the ledger marks %s done: %v; %d run record(s)",
		orNone(strings.Join(completed, ", ")), s.CompletedToken, orNone(strings.Join(foundDone, ", ")), orNone(s.Frozen), s.Period, s.Stores.LedgerDone, s.Stores.Runs)
	if len(other) > 0 {
		add(false, "other RunOnce errors: %s", strings.Join(other, "; "))
	}

	// Every late write refused as stale, naming a newer token.
	newer := true
	for _, w := range s.LateWrites {
		newer = newer && w.Outcome == outcomeStale && w.Current > w.Token
	}
	add(s.Frozen != "" && refused[storeMariaDB] > 0 && refused[storeInventory] > 0 && newer && len(s.LateWrites) == outcomes[outcomeStale],
		"every late write refused as stale: %d of %d (%s, frozen with token %d: %d MariaDB transactions and %d inventory calls refused, each naming a newer token)",
		outcomes[outcomeStale], len(s.LateWrites), orNone(s.Frozen), s.FrozenToken, refused[storeMariaDB], refused[storeInventory])

	// The job's effects, exactly once.
	st := s.Stores
	add(st.OpenOrders == 0 && st.Payouts == s.Orders && len(st.NotPaidOnce) == 0 && st.PayoutCents == st.OrderCents,
		"MariaDB: each of the %d orders settled and paid exactly once: %d open, %d payouts (orders not paid once: %v), %d of %d cents; settled by %s",
		s.Orders, st.OpenOrders, st.Payouts, st.NotPaidOnce, st.PayoutCents, st.OrderCents, byReplica(st.SettledBy))
	releasedBy := map[string]int{}
	allReleased := len(st.Released) == s.Orders
	for id := 1; id <= s.Orders; id++ {
		rel, ok := st.Released[id]
		allReleased = allReleased && ok
		releasedBy[rel.Replica]++
	}
	add(allReleased, "inventory: each of the %d orders' stock released exactly once (%d released, by %s); %d repeated calls changed nothing",
		s.Orders, len(st.Released), byReplica(releasedBy), st.Repeats)

	s.judgeMetrics(add, refused)

	s.Checks, s.OK = checks, true
	for _, c := range checks {
		s.OK = s.OK && c.OK
	}
	switch {
	case s.OK:
		s.Verdict = fmt.Sprintf("SAFE. %s, frozen past its lease, made %d writes after its lease ended; MariaDB and the inventory service refused every one as stale. "+
			"Each order was settled and its stock released exactly once, and the night ran once. The metrics showed it: %s's job gauge dropped to 0 when its lease ended, and its refused writes are counted as stale.",
			s.Frozen, len(s.LateWrites), s.Frozen)
	default:
		s.Verdict = "UNSAFE, or not shown: a check failed (below)."
	}
}

// judgeMetrics checks what the replicas' /metrics showed at each moment.
func (s *summary) judgeMetrics(add func(bool, string, ...any), refused map[string]int) {
	find := func(kind string) (sample, bool) {
		for _, x := range s.Samples {
			if x.Kind == kind {
				return x, true
			}
		}
		return sample{}, false
	}
	if x, ok := find(sampleBeforeFreeze); ok {
		m := x.Replicas[s.Frozen]
		add(m.Answered && m.JobRunning == 1 && x.jobRunningSum() == 1,
			"metrics as %s ran the job: its fencekit_job_running{lease=%q} %v, summed over the replicas %v (want 1 and 1)", s.Frozen, s.Job, m.JobRunning, x.jobRunningSum())
	} else {
		add(false, "metrics: no reading before the freeze")
	}
	if x, ok := find(sampleFrozen); ok {
		m, running := x.Replicas[s.Frozen], ""
		for name, r := range x.Replicas {
			if r.JobRunning == 1 {
				running += " " + name
			}
		}
		add(!m.Answered && x.jobRunningSum() == 1,
			"metrics while %s was frozen: it did not answer (Prometheus: up == 0); the job gauge was 1 on%s, summed %v",
			s.Frozen, orNone(running), x.jobRunningSum())
	} else {
		add(false, "metrics: no reading while the holder was frozen")
	}
	if x, ok := find(sampleAfterResume); ok {
		m := x.Replicas[s.Frozen]
		add(m.Answered && m.JobRunning == 0 && m.Lost >= 1,
			"metrics once %s ran again, its job still going: fencekit_job_running %v (its lease had ended), fencekit_lease_lost_total %v (want 0 and 1)",
			s.Frozen, m.JobRunning, m.Lost)
	} else {
		add(false, "metrics: no reading after the frozen replica was resumed")
	}
	if x, ok := find(sampleFinal); ok {
		answered, running := 0, 0.0
		for _, m := range x.Replicas {
			if m.Answered {
				answered++
			}
			running += m.JobRunning
		}
		m := x.Replicas[s.Frozen]
		inv := s.InventoryMetrics.Writes["fencehttp stale"]
		add(answered == s.Replicas && running == 0 &&
			m.Writes["dbguard stale"] == float64(refused[storeMariaDB]) && m.Writes["fencehttp stale"] == float64(refused[storeInventory]) &&
			inv == float64(refused[storeInventory]),
			"metrics after the night: %d of %d replicas answered, job gauges summed %v; %s counted %v stale dbguard writes and %v stale fencehttp calls, "+
				"the inventory service %v stale admissions (want %d, %d, %d)",
			answered, s.Replicas, running, s.Frozen, m.Writes["dbguard stale"], m.Writes["fencehttp stale"], inv,
			refused[storeMariaDB], refused[storeInventory], refused[storeInventory])
	} else {
		add(false, "metrics: no reading after the night")
	}
}

// print writes the metrics, the stores, the checks and the verdict.
func (s *summary) print(out io.Writer) {
	fmt.Fprintf(out, "\nMetrics (each replica's /metrics, read as Prometheus would scrape it):\n")
	for _, x := range s.Samples {
		fmt.Fprintf(out, "  %s:\n", x.Moment)
		for _, name := range slices.Sorted(maps.Keys(x.Replicas)) {
			m := x.Replicas[name]
			if !m.Answered {
				fmt.Fprintf(out, "    %-10s  no answer: %s\n", name, m.Error)
				continue
			}
			fmt.Fprintf(out, "    %-10s  job_running %v  lease_held %v  lost %v  %s\n", name, m.JobRunning, m.LeaseHeld, m.Lost, writesText(m))
		}
	}
	fmt.Fprintf(out, "  the inventory service's own metrics (fencehttp.Handler.Observer): %s\n", writesText(s.InventoryMetrics))
	st := s.Stores
	fmt.Fprintf(out, "\nStores:\n  MariaDB: %d of %d orders settled (%s), %d payouts; %d run record(s) for %s; ledger done: %v\n"+
		"  inventory service: %d orders' stock released; %d repeated calls\n",
		s.Orders-st.OpenOrders, s.Orders, byReplica(st.SettledBy), st.Payouts, st.Runs, s.Period, st.LedgerDone, len(st.Released), st.Repeats)
	fmt.Fprintf(out, "\nChecks:\n")
	for _, c := range s.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(out, "  %s  %s\n", mark, c.Text)
	}
	fmt.Fprintf(out, "\nVERDICT: %s\n", s.Verdict)
}

// writesText shows fencekit_guard_writes_total by guard and outcome.
func writesText(m metrics) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m.Writes)) {
		if m.Writes[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s %v", k, m.Writes[k]))
		}
	}
	return "writes: " + orNone(strings.Join(parts, ", "))
}

func byReplica(n map[string]int) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, n[name]))
	}
	return orNone(strings.Join(parts, ", "))
}

func orNone(s string) string {
	if strings.TrimSpace(s) == "" {
		return "none"
	}
	return s
}
