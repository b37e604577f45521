package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
)

// verify reads the outcome from the row store, replays the writes of every
// holder but the newest with their old tokens, and records the checks and
// the verdict in sum. The checks work on what rows.read returns, the same
// for every row store; it returns an error only when the store could not
// be read.
func (sc *scenario) verify(ctx context.Context, tl *demo.Timeline, o options, sum *summary) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	v := &verifier{sc: sc, ctx: ctx, tl: tl, o: o, sum: sum, where: sc.rows.where(), byToken: map[fence.Token]*holder{}}
	var err error
	if v.before, err = sc.rows.read(ctx); err != nil {
		return fmt.Errorf("reading %s: %w", v.where, err)
	}
	for _, p := range sum.problems {
		v.add(false, "during the run: %s", p)
	}
	v.checkTokens()
	v.checkInvoices()
	v.checkWriters()
	v.checkHandovers()
	v.checkProgress()
	v.checkResource()
	if err := v.replayStale(); err != nil {
		return err
	}
	v.checkFates()
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
	where   string // the row store's name
	before  stored // what the row store held before the stale replays
	byToken map[fence.Token]*holder
	newest  fence.Token // the newest holder's token
}

func (v *verifier) add(ok bool, format string, args ...any) {
	v.sum.Checks = append(v.sum.Checks, check{OK: ok, Text: fmt.Sprintf(format, args...)})
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
func (v *verifier) checkInvoices() {
	o, invs := v.o, v.before.invoices
	distinct := map[string]bool{}
	misnumbered := 0
	for i, inv := range invs {
		distinct[inv.Customer] = true
		if inv.Number != i+1 {
			misnumbered++
		}
	}
	missing := 0
	for _, c := range v.sc.customers {
		if !distinct[c.ID] {
			missing++
		}
	}
	total := len(invs)
	v.sum.Invoices = total
	v.add(total == o.customers && len(distinct) == o.customers && missing == 0,
		"%s: %d invoices for period %s, for %d distinct customers of %d; %d missing, %d written twice",
		v.where, total, o.period, len(distinct), o.customers, missing, total-len(distinct))
	v.add(misnumbered == 0, "%s: invoice numbers run 1..%d in customer order, no gap and no repeat (%d out of place)", v.where, total, misnumbered)
}

// writerGroup is the invoices written under one token by one replica.
type writerGroup struct {
	token     fence.Token
	by        string
	n, lo, hi int
}

// writerGroups groups invs by (lock_version, written_by), in the order of
// their first invoice number.
func writerGroups(invs []invoice) []writerGroup {
	type key struct {
		token fence.Token
		by    string
	}
	at := map[key]int{}
	var groups []writerGroup
	for _, inv := range invs {
		k := key{inv.LockVersion, inv.WrittenBy}
		i, ok := at[k]
		if !ok {
			i = len(groups)
			at[k] = i
			groups = append(groups, writerGroup{token: k.token, by: k.by, lo: inv.Number, hi: inv.Number})
		}
		g := &groups[i]
		g.n++
		g.lo, g.hi = min(g.lo, inv.Number), max(g.hi, inv.Number)
	}
	slices.SortFunc(groups, func(a, b writerGroup) int { return a.lo - b.lo })
	return groups
}

// checkWriters: every invoice carries the token of the holder that wrote
// it, and the holders' ranges follow each other in token order.
func (v *verifier) checkWriters() {
	groups := writerGroups(v.before.invoices)
	var foreign []string
	for _, g := range groups {
		h := v.byToken[g.token]
		if h == nil || h.Replica != g.by {
			foreign = append(foreign, fmt.Sprintf("%d invoices say %s with token %d", g.n, g.by, g.token))
			continue
		}
		h.Written, h.First, h.Last = g.n, g.lo, g.hi
	}
	v.add(len(foreign) == 0, "%s: every invoice's lock_version is the token of the holder that wrote it%s", v.where, listOr(foreign, "; not so: "))
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
}

// checkHandovers: every kill landed mid-batch, and the handover came
// within the bound.
func (v *verifier) checkHandovers() {
	o := v.o
	for _, k := range v.sum.Handovers {
		h := v.byToken[k.FromToken]
		v.add(h != nil && h.Written > 0 && h.Written < o.customers,
			"%s (token %d) was killed mid-batch: %d of %d invoices were committed under its token", k.From, k.FromToken, writtenOf(h), o.customers)
		if k.To == "" {
			v.add(false, "nobody took over after %s was killed", k.From)
			continue
		}
		lag := v.sc.cfg.Leases().ExpiryLag()
		bound := fmt.Sprintf("TTL + renew interval + %v for a loaded machine", loadAllowance)
		if lag > 0 {
			bound += fmt.Sprintf(" + %v, how late %s may expire it", lag, storeName(o.LeaseStore))
		}
		v.add(k.Took > 0 && k.Took <= o.handoverBound(lag),
			"%s took over %v after the kill (its grant had %s left in %s; bound: %s = %v)",
			k.To, k.Took.Round(time.Millisecond), leftText(o.LeaseStore, k.LeaseLeft), storeName(o.LeaseStore), bound, o.handoverBound(lag).Round(time.Millisecond))
	}
	if len(v.sum.Handovers) < o.kills {
		v.add(false, "only %d of %d kills happened", len(v.sum.Handovers), o.kills)
	}
}

// checkProgress: the progress row says the batch is complete.
func (v *verifier) checkProgress() {
	b := v.before
	v.add(b.next == v.o.customers && b.completed, "%s: the progress row is complete (next_index %d of %d, completed: %v, lock_version %d)",
		v.where, b.next, v.o.customers, b.completed, b.progressTok)
}

// checkResource: the resource holds the newest holder's token.
func (v *verifier) checkResource() {
	v.add(v.newest != 0 && v.before.resource == v.newest, "%s: resource %q holds token %d, the newest holder's",
		v.where, resourceFor(v.o.period), v.before.resource)
}

// replay is one stale write the verifier replayed.
type replay struct {
	Replica string      `json:"replica"`
	Token   fence.Token `json:"token"`
	// Invoice is the number of the invoice the write was for.
	Invoice int `json:"invoice"`
	// Stale says that the store rejected it as stale; Current is then the
	// token the store said it holds. Error is any other outcome's error
	// ("" when the write was accepted).
	Stale   bool        `json:"stale"`
	Current fence.Token `json:"current,omitempty"`
	Error   string      `json:"error,omitempty"`
}

// replayStale: a stale holder cannot write. For every holder but the
// newest it replays, with the holder's old token, the write it would have
// made next (a killed holder's: the invoice it was on when it was killed),
// as a holder that woke up after being paused (or a dead one's retried
// request) would, and checks that nothing changed.
func (v *verifier) replayStale() error {
	for _, h := range v.sum.Holders {
		if h.Token == v.newest {
			continue
		}
		at := min(max(h.ResumedAt, 0)+h.Written, v.o.customers-1)
		err := v.sc.rows.replay(v.ctx, h.Token, h.Replica, at)
		se, stale := fence.AsStale(err)
		r := replay{Replica: h.Replica, Token: h.Token, Invoice: at + 1, Stale: stale}
		switch {
		case stale:
			r.Current = se.Current
			v.tl.Say(time.Now(), "orchestrator", "replayed %s's write of invoice #%d with its old token %d: REJECTED by %s (the resource holds token %d)",
				h.Replica, at+1, h.Token, v.where, se.Current)
		case err == nil:
			v.tl.Say(time.Now(), "orchestrator", "replayed %s's write of invoice #%d with its old token %d: ACCEPTED", h.Replica, at+1, h.Token)
		default:
			r.Error = err.Error()
			v.tl.Say(time.Now(), "orchestrator", "replayed %s's write of invoice #%d with its old token %d: failed: %v", h.Replica, at+1, h.Token, err)
		}
		v.sum.Replays = append(v.sum.Replays, r)
		v.add(stale, "a write with %s's old token %d is rejected as stale by %s%s", h.Replica, h.Token, v.where, errSuffix(err, stale))
	}
	after, err := v.sc.rows.read(v.ctx)
	if err != nil {
		return fmt.Errorf("reading %s after the replays: %w", v.where, err)
	}
	b := v.before
	rest := after.next == b.next && after.completed == b.completed && after.progressTok == b.progressTok && after.resource == b.resource
	v.add(slices.Equal(after.invoices, b.invoices) && rest,
		"%s: the stale replays changed nothing (%d invoices before, %d after, none rewritten; progress row and resource as they were: %v)",
		v.where, len(b.invoices), len(after.invoices), rest)
	return nil
}

// checkFates: every replica held the lease once; exactly one completed the
// batch; the others that were not killed found it complete.
func (v *verifier) checkFates() {
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
		handovers = fmt.Sprintf("%d holder(s) killed mid-batch, taken over in %s (TTL %v)", len(took), strings.Join(took, ", "), o.TTL)
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
				k.From, k.FromToken, tl.Rel(k.KilledAt), leftText(o.LeaseStore, k.LeaseLeft), storeName(o.LeaseStore), to, o.TTL, o.renewInterval().Round(time.Millisecond))
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
