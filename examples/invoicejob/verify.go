package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// verify reads the outcome from the database, replays the writes of every
// holder but the newest with their old tokens, and records the checks and
// the verdict in sum. Each step below adds its checks; a step returns an
// error only when the database could not be read.
func (sc *scenario) verify(ctx context.Context, tl *demo.Timeline, o options, sum *summary) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	v := &verifier{sc: sc, ctx: ctx, tl: tl, o: o, sum: sum, byToken: map[fence.Token]*holder{}}
	for _, p := range sum.problems {
		v.add(false, "during the run: %s", p)
	}
	v.checkTokens()
	steps := []func() error{v.checkInvoices, v.checkWriters, v.checkHandovers, v.checkProgress, v.checkResource, v.replayStale, v.checkFates}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	v.verdict()
	return nil
}

// verifier holds what the steps of verify share.
type verifier struct {
	sc      *scenario
	ctx     context.Context
	tl      *demo.Timeline
	o       options
	sum     *summary
	byToken map[fence.Token]*holder
	total   int         // invoices of the period, before the stale replays
	newest  fence.Token // the newest holder's token
}

func (v *verifier) add(ok bool, format string, args ...any) {
	v.sum.Checks = append(v.sum.Checks, check{OK: ok, Text: fmt.Sprintf(format, args...)})
}

func (v *verifier) ident(table string) string {
	return pgx.Identifier{v.sc.cfg.Schema, table}.Sanitize()
}

// checkTokens: tokens only grow, in the order the replicas acquired the
// lease.
func (v *verifier) checkTokens() {
	ok := len(v.sum.Holders) > 0
	for i, h := range v.sum.Holders {
		v.byToken[h.Token] = h
		if i > 0 && h.Token <= v.sum.Holders[i-1].Token {
			ok = false
		}
	}
	if n := len(v.sum.Holders); n > 0 {
		v.newest = v.sum.Holders[n-1].Token
	}
	v.add(ok, "%d grants of the lease, each with a fencing token greater than the one before", len(v.sum.Holders))
}

// checkInvoices: exactly one invoice per customer, none missing, none
// twice, numbered in customer order.
func (v *verifier) checkInvoices() error {
	o, pool := v.o, v.sc.Pool
	var distinct, missing, misnumbered int
	if err := pool.QueryRow(v.ctx, `SELECT count(*), count(DISTINCT customer) FROM `+v.ident(invoicesTable)+` WHERE period = $1`, o.period).
		Scan(&v.total, &distinct); err != nil {
		return err
	}
	if err := pool.QueryRow(v.ctx, `SELECT count(*) FROM `+v.ident(customersTable)+` c
		WHERE NOT EXISTS (SELECT 1 FROM `+v.ident(invoicesTable)+` i WHERE i.customer = c.id AND i.period = $1)`, o.period).
		Scan(&missing); err != nil {
		return err
	}
	if err := pool.QueryRow(v.ctx, `SELECT count(*) FROM (SELECT number, row_number() OVER (ORDER BY customer) AS rn
		FROM `+v.ident(invoicesTable)+` WHERE period = $1) x WHERE number <> rn`, o.period).Scan(&misnumbered); err != nil {
		return err
	}
	v.sum.Invoices = v.total
	v.add(v.total == o.customers && distinct == o.customers && missing == 0,
		"database: %d invoices for period %s, for %d distinct customers of %d; %d missing, %d written twice",
		v.total, o.period, distinct, o.customers, missing, v.total-distinct)
	v.add(misnumbered == 0, "database: invoice numbers run 1..%d in customer order, no gap and no repeat (%d out of place)", v.total, misnumbered)
	return nil
}

// writerGroup is the invoices written under one token.
type writerGroup struct {
	token     int64
	by        string
	n, lo, hi int
}

// checkWriters: every invoice carries the token of the holder that wrote
// it, and the holders' ranges follow each other in token order.
func (v *verifier) checkWriters() error {
	groups, err := v.writerGroups()
	if err != nil {
		return err
	}
	var foreign []string
	for _, g := range groups {
		h := v.byToken[fence.Token(g.token)]
		if h == nil || h.Replica != g.by {
			foreign = append(foreign, fmt.Sprintf("%d invoices say %s with token %d", g.n, g.by, g.token))
			continue
		}
		h.Written, h.First, h.Last = g.n, g.lo, g.hi
	}
	v.add(len(foreign) == 0, "database: every invoice's lock_version is the token of the holder that wrote it%s", listOr(foreign, "; not so: "))
	inOrder := true
	for i := 1; i < len(groups); i++ {
		if groups[i].token <= groups[i-1].token || groups[i].lo != groups[i-1].hi+1 {
			inOrder = false
		}
	}
	var resumes []string
	done := 0
	for _, h := range v.sum.Holders {
		if h.ResumedAt >= 0 && h.ResumedAt != done {
			inOrder = false
			resumes = append(resumes, fmt.Sprintf("%s resumed at #%d, but %d were committed before it", h.Replica, h.ResumedAt+1, done))
		}
		done += h.Written
	}
	v.add(inOrder, "each holder resumed exactly where the one before stopped, and wrote in token order%s", listOr(resumes, ": "))
	return nil
}

func (v *verifier) writerGroups() ([]writerGroup, error) {
	rows, err := v.sc.Pool.Query(v.ctx, `SELECT lock_version, written_by, count(*), min(number), max(number)
		FROM `+v.ident(invoicesTable)+` WHERE period = $1 GROUP BY 1, 2 ORDER BY 4`, v.o.period)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var groups []writerGroup
	for rows.Next() {
		var g writerGroup
		if err := rows.Scan(&g.token, &g.by, &g.n, &g.lo, &g.hi); err != nil {
			return nil, err
		}
		groups = append(groups, g)
	}
	return groups, rows.Err()
}

// checkHandovers: every kill landed mid-batch, and the handover came
// within the bound.
func (v *verifier) checkHandovers() error {
	o := v.o
	for _, k := range v.sum.Handovers {
		h := v.byToken[k.FromToken]
		v.add(h != nil && h.Written > 0 && h.Written < o.customers,
			"%s (token %d) was killed mid-batch: %d of %d invoices were committed under its token", k.From, k.FromToken, writtenOf(h), o.customers)
		if k.To == "" {
			v.add(false, "nobody took over after %s was killed", k.From)
			continue
		}
		lag := v.sc.cfg.leaseStore().ExpiryLag()
		bound := fmt.Sprintf("TTL + renew interval + %v for a loaded machine", loadAllowance)
		if lag > 0 {
			bound += fmt.Sprintf(" + %v, how late %s may expire it", lag, storeName(o.leaseStore))
		}
		v.add(k.Took > 0 && k.Took <= o.handoverBound(lag),
			"%s took over %v after the kill (its grant had %s left in %s; bound: %s = %v)",
			k.To, k.Took.Round(time.Millisecond), leftText(o.leaseStore, k.LeaseLeft), storeName(o.leaseStore), bound, o.handoverBound(lag).Round(time.Millisecond))
	}
	if len(v.sum.Handovers) < o.kills {
		v.add(false, "only %d of %d kills happened", len(v.sum.Handovers), o.kills)
	}
	return nil
}

// checkProgress: the progress row says the batch is complete.
func (v *verifier) checkProgress() error {
	var next int
	var completed bool
	var jobVersion int64
	if err := v.sc.Pool.QueryRow(v.ctx, `SELECT next_index, completed_at IS NOT NULL, lock_version FROM `+v.ident(jobTable)+` WHERE period = $1`, v.o.period).
		Scan(&next, &completed, &jobVersion); err != nil {
		return err
	}
	v.add(next == v.o.customers && completed, "database: the progress row is complete (next_index %d of %d, completed: %v, lock_version %d)", next, v.o.customers, completed, jobVersion)
	return nil
}

// checkResource: the resource holds the newest holder's token.
func (v *verifier) checkResource() error {
	var resTok int64
	err := v.sc.Pool.QueryRow(v.ctx, `SELECT token FROM `+v.ident(sqlguard.ResourceTable)+` WHERE resource = $1`, resourceFor(v.o.period)).Scan(&resTok)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	v.add(v.newest != 0 && fence.Token(resTok) == v.newest, "database: resource %q holds token %d, the newest holder's", resourceFor(v.o.period), resTok)
	return nil
}

// replayStale: a stale holder cannot write. It replays the next write of
// every holder but the newest, with its old token, as a holder that woke
// up after being paused (or a dead one's retried request) would, and
// checks that nothing changed.
func (v *verifier) replayStale() error {
	b, err := newBatch(v.sc.cfg.Schema, v.o.period, v.sc.customers)
	if err != nil {
		return err
	}
	for _, h := range v.sum.Holders {
		if h.Token == v.newest {
			continue
		}
		_, err := b.step(v.ctx, v.sc.Pool, h.Token, h.Replica, 0, nil)
		se, stale := fence.AsStale(err)
		switch {
		case stale:
			v.tl.Say(time.Now(), "orchestrator", "replayed a write of %s with its old token %d: REJECTED by PostgreSQL (the resource holds token %d)", h.Replica, h.Token, se.Current)
		case err == nil:
			v.tl.Say(time.Now(), "orchestrator", "replayed a write of %s with its old token %d: ACCEPTED", h.Replica, h.Token)
		default:
			v.tl.Say(time.Now(), "orchestrator", "replayed a write of %s with its old token %d: failed: %v", h.Replica, h.Token, err)
		}
		v.add(stale, "a write with %s's old token %d is rejected as stale%s", h.Replica, h.Token, errSuffix(err, stale))
	}
	var after int
	if err := v.sc.Pool.QueryRow(v.ctx, `SELECT count(*) FROM `+v.ident(invoicesTable)+` WHERE period = $1`, v.o.period).Scan(&after); err != nil {
		return err
	}
	v.add(after == v.total, "database: the stale replays changed nothing (%d invoices before, %d after)", v.total, after)
	return nil
}

// checkFates: every replica held the lease once; exactly one completed the
// batch; the others that were not killed found it complete.
func (v *verifier) checkFates() error {
	completers, clean := 0, true
	for _, h := range v.sum.Holders {
		switch {
		case h.Fate == evCompleted:
			completers++
		case h.Fate == evNothing, !h.KilledAt.IsZero():
		default:
			clean = false
		}
	}
	v.add(len(v.sum.Holders) == v.o.replicas && completers == 1 && clean,
		"all %d replicas held the lease in turn: %d killed, %d completed the batch, the rest found it complete", len(v.sum.Holders), len(v.sum.Handovers), completers)
	return nil
}

// verdict sums the checks up.
func (v *verifier) verdict() {
	sum, o := v.sum, v.o
	var failed []string
	for _, c := range sum.Checks {
		if !c.OK {
			failed = append(failed, c.Text)
		}
	}
	if len(failed) > 0 {
		sum.OK = false
		sum.Verdict = fmt.Sprintf("VERDICT: FAILED. %d of %d checks failed: %s.", len(failed), len(sum.Checks), strings.Join(failed, "; "))
		return
	}
	sum.OK = true
	var took []string
	for _, k := range sum.Handovers {
		took = append(took, k.Took.Round(time.Millisecond).String())
	}
	handovers := "no holder was killed"
	if len(took) > 0 {
		handovers = fmt.Sprintf("%d holder(s) killed mid-batch, taken over in %s (TTL %v)", len(took), strings.Join(took, ", "), o.ttl)
	}
	sum.Verdict = fmt.Sprintf("VERDICT: SAFE. %s; every one of the %d customers has exactly one invoice for %s, each written under a valid lease's token, and the old tokens can no longer write.",
		handovers, o.customers, o.period)
}

func writtenOf(h *holder) int {
	if h == nil {
		return 0
	}
	return h.Written
}

func listOr(items []string, prefix string) string {
	if len(items) == 0 {
		return ""
	}
	return prefix + strings.Join(items, "; ")
}

func errSuffix(err error, stale bool) string {
	switch {
	case stale:
		return ""
	case err == nil:
		return ": it was ACCEPTED"
	}
	return ": " + err.Error()
}

// print writes the summary table, the checks and the verdict.
func (sum *summary) print(out io.Writer, tl *demo.Timeline, o options) {
	fmt.Fprintf(out, "\nHolders of the lease, in the order they acquired it:\n")
	fmt.Fprintf(out, "  %-11s %-8s %-18s %-10s %-8s %-17s %s\n", "replica", "pid", "token", "acquired", "resumed", "invoices (DB)", "how it ended")
	for _, h := range sum.Holders {
		resumed := "-"
		if h.ResumedAt >= 0 && h.ResumedAt < o.customers {
			resumed = fmt.Sprintf("#%d", h.ResumedAt+1)
		}
		inv := "0"
		if h.Written > 0 {
			inv = fmt.Sprintf("%d (#%d-#%d)", h.Written, h.First, h.Last)
		}
		fate := fateText(h.Fate)
		if !h.KilledAt.IsZero() {
			fate += " at " + tl.Rel(h.KilledAt)
		}
		fmt.Fprintf(out, "  %-11s %-8d %-18d %-10s %-8s %-17s %s\n", h.Replica, h.Pid, h.Token, tl.Rel(h.AcquiredAt), resumed, inv, fate)
	}
	if len(sum.Handovers) > 0 {
		fmt.Fprintf(out, "\nHandovers (from the kill to the next acquire):\n")
		for _, k := range sum.Handovers {
			to := "nobody"
			if k.To != "" {
				to = fmt.Sprintf("%s acquired at %s with token %d: handover %v", k.To, tl.Rel(k.Acquired), k.ToToken, k.Took.Round(time.Millisecond))
			}
			fmt.Fprintf(out, "  %s (token %d) killed at %s, its grant had %s left in %s; %s (TTL %v, renew interval %v)\n",
				k.From, k.FromToken, tl.Rel(k.KilledAt), leftText(o.leaseStore, k.LeaseLeft), storeName(o.leaseStore), to, o.ttl, o.renewInterval().Round(time.Millisecond))
		}
	}
	fmt.Fprintf(out, "\nChecks:\n")
	for _, c := range sum.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(out, "  %s  %s\n", mark, c.Text)
	}
	fmt.Fprintf(out, "\n%s\n", sum.Verdict)
}
