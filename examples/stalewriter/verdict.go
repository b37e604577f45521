package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// This file derives the verdict from what happened: the events the workers
// reported (who acquired which token when, when a lease ended, and every
// write attempt with its store, the lease as the writer saw it when it sent
// the write, and the store's answer) and the final state read back from
// the stores. Nothing in it assumes the scenario went as planned: a pause
// too short to lose the lease, a stale write that reached a store before
// the newer holder's write, and a stale write that overwrote newer data are
// each told apart from the events alone.

// Outcomes of a write attempt, as the store answered.
const (
	outcomeAccepted = "accepted"
	outcomeStale    = "stale"  // rejected: the store has accepted a newer token
	outcomeFailed   = "failed" // any other error
)

// verdict is the judgement of one run.
type verdict struct {
	// OK is false when a stale write landed after a newer one or the
	// final data is not the newest accepted token's (unsafe), and when
	// the run showed nothing because a write failed for another reason
	// than a stale token (Inconclusive).
	OK bool
	// Inconclusive is set when a write failed, or was rejected, without a
	// newer token to explain it: the run does not show what it was meant
	// to.
	Inconclusive bool
	// Lines are the verdict, headline first; each is short enough to read
	// on a terminal line or two.
	Lines []string
}

func (v verdict) String() string { return strings.Join(v.Lines, "\n") }

// grant is one acquire of the lease.
type grant struct {
	role  string
	token fence.Token
	at    time.Time
}

// writeView is one write attempt with what the verdict needs to know about
// the writer's lease at the moment it sent the write.
type writeView struct {
	event
	// lostAt is when the writer's lease had ended before the write was
	// sent (zero if it had not): its local deadline, or the moment a newer
	// grant was made, whichever came first.
	lostAt time.Time
	// newer is the first grant with a greater token made before the write
	// was sent (nil if none).
	newer *grant
}

// judge computes the verdict of a run from its events and final state.
func judge(events []event, final finalState, unguarded bool) verdict {
	grants := grantsOf(events)
	f := &findings{unguarded: unguarded}
	rowStore := "postgres"
	if final.RowStore != "" {
		rowStore = final.RowStore
	}
	f.store(rowStore, writesTo(events, rowStore, grants), final.RowWrittenBy, final.RowToken)
	f.store("s3", writesTo(events, "s3", grants), final.ObjectWrittenBy, final.ObjectToken)
	if final.Item {
		f.store("dynamodb", writesTo(events, "dynamodb", grants), final.ItemWrittenBy, final.ItemToken)
	}
	if !unguarded && final.RowLockVersion != 0 && fence.Token(final.RowLockVersion) != final.RowToken {
		f.problems = append(f.problems, fmt.Sprintf("%s: lock_version %d does not match the row's token %d.", cmpStore(final.RowStore), final.RowLockVersion, final.RowToken))
	}
	return f.verdict(events)
}

// grantsOf returns the grants of the lease in the events, in time order.
func grantsOf(events []event) []grant {
	var grants []grant
	for _, e := range events {
		if e.Kind == evAcquired {
			grants = append(grants, grant{role: e.Role, token: e.Token, at: e.At})
		}
	}
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
	return grants
}

// findings is what judge found in the writes to the stores.
type findings struct {
	unguarded bool
	problems  []string // what makes the run unsafe
	failures  []string // what makes the run show nothing
	notes     []string // what happened to writes made after a lease ended
	late      int      // writes sent after the writer's lease had ended
	lateOK    int      // of those, accepted (by order alone, or unguarded)
	rejected  int      // stale writes the stores rejected
	// who wrote late and was accepted by order, and the newer holder
	// that had not written yet
	lateWriter, lateNewer string
	rejectedWriter        string // who wrote late and was rejected
}

// store judges the writes to one store, whose final state is by's data
// with the token tok.
//
// The store's own order of the writes it accepted is not their send
// order: two writes in flight at once land in either order (a fenced
// transaction waits for the other's row lock). What is certain: a write
// answered before another was sent came first; the final state is the last
// accepted; and a rejection names the newer token the store had accepted.
func (f *findings) store(store string, writes []writeView, by string, tok fence.Token) {
	var newest *writeView // the accepted write with the greatest token
	for i := range writes {
		if w := &writes[i]; w.Outcome == outcomeAccepted && (newest == nil || w.Token > newest.Token) {
			newest = w
		}
	}
	overwrote := false // a stale write was seen landing after a newer one
	for i := range writes {
		w := &writes[i]
		if !w.lostAt.IsZero() {
			f.late++
		}
		switch {
		case w.Outcome == outcomeAccepted:
			if before := acceptedBefore(writes, w); before != nil {
				f.lateOK++
				overwrote = true
				f.problems = append(f.problems, fmt.Sprintf("%s ACCEPTED %s's write with stale token %d after %s's with token %d: %s's update is lost.",
					store, w.Role, w.Token, before.Role, before.Token, before.Role))
			} else if !w.lostAt.IsZero() {
				f.lateOK++
				note, newer := lateAcceptedNote(store, w, newest, by, tok, f.unguarded)
				f.notes = append(f.notes, note)
				f.lateWriter, f.lateNewer = w.Role, newer
			}
		case w.Outcome == outcomeStale:
			if v := acceptedWith(writes, w.Current, w.Token); v != nil {
				f.rejected++
				f.rejectedWriter = w.Role
				f.notes = append(f.notes, fmt.Sprintf("%s REJECTED %s's write (token %d) %s: %s's write had reached it first.",
					store, w.Role, w.Token, lostPhrase(w), v.Role))
			} else {
				f.failures = append(f.failures, fmt.Sprintf("%s rejected %s's write (token %d) as stale, but no newer write was accepted there.",
					store, w.Role, w.Token))
			}
		default:
			f.failures = append(f.failures, fmt.Sprintf("%s: %s's write (token %d) FAILED: %s", store, w.Role, w.Token, firstLine(w.Error, 120)))
		}
	}
	if newest != nil && (by != newest.Role || tok != newest.Token) && !overwrote {
		f.problems = append(f.problems, fmt.Sprintf("%s holds %s's data (token %d), not that of the newest accepted token %d (%s).",
			store, orNone(by), tok, newest.Token, newest.Role))
	}
}

// verdict turns the findings into the verdict: a headline and the findings
// that explain it.
func (f *findings) verdict(events []event) verdict {
	v := verdict{OK: len(f.problems) == 0 && len(f.failures) == 0, Inconclusive: len(f.problems) == 0 && len(f.failures) > 0}
	say := func(lines ...string) { v.Lines = append(v.Lines, lines...) }
	switch {
	case v.Inconclusive:
		say("VERDICT: NOT SHOWN: a write failed for another reason than a stale token.")
		say(indent(f.failures)...)
		say(indent(f.notes)...)
	case len(f.problems) > 0:
		say("VERDICT: UNSAFE.")
		say(indent(f.problems)...)
		say(indent(f.failures)...)
		say(indent(f.notes)...)
		if f.unguarded {
			say("A lease alone allows this: the paused holder woke up and wrote over the newer holder's data.",
				"Run without --unguarded to see the stores reject it.")
		}
	case f.late == 0:
		say("VERDICT: SAFE. No stale write was attempted: every write was sent while its writer held the lease.")
		if fr, ok := freeze(events); ok {
			say(fmt.Sprintf("  A was frozen for %s and its lease had %s left, so it kept its lease; use a --pause longer than --ttl to see a stale write.",
				ms(fr.pause), ms(fr.remaining)))
		}
	case f.unguarded:
		say("VERDICT: NO OVERWRITE THIS TIME, by luck of timing alone: nothing checked the tokens.")
		say(indent(f.notes)...)
	case f.lateOK > 0:
		say(fmt.Sprintf("VERDICT: SAFE, BY TOKEN ORDER: %s wrote after losing its lease, and was accepted only because %s had not written yet.",
			f.lateWriter, orElse(f.lateNewer, "the newer holder")))
		say(indent(f.notes)...)
		say("  Fencing orders writes by token; it cannot stop a stale write that arrives before the newer one. The newest token's data survived.")
	default:
		say(fmt.Sprintf("VERDICT: SAFE. The stores rejected %s %s made after losing its lease; the newest token's data survived.",
			plural(f.rejected, "the write", "all %d writes"), f.rejectedWriter))
		say(indent(f.notes)...)
	}
	return v
}

// writesTo returns the write attempts to store in the order they were sent,
// each with the state of its writer's lease at that moment.
func writesTo(events []event, store string, grants []grant) []writeView {
	var ws []writeView
	for _, e := range events {
		if e.Kind != evWrite || e.Store != store {
			continue
		}
		w := writeView{event: e}
		if w.Sent.IsZero() {
			w.Sent = w.At
		}
		for i := range grants {
			if g := &grants[i]; g.token > w.Token && !g.at.After(w.Sent) {
				w.newer = g
				break
			}
		}
		expired := !w.Deadline.IsZero() && w.Sent.After(w.Deadline)
		switch {
		case expired && (w.newer == nil || w.Deadline.Before(w.newer.at)):
			w.lostAt = w.Deadline
		case w.newer != nil:
			w.lostAt = w.newer.at
		}
		ws = append(ws, w)
	}
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].Sent.Before(ws[j].Sent) })
	return ws
}

// lateAcceptedNote says, for an accepted write sent after its writer's lease
// had ended, why the store took it and what became of it (newest is the
// store's newest accepted write, finalBy and finalTok its final state), and
// names the newer holder (empty if none is known).
func lateAcceptedNote(store string, w, newest *writeView, finalBy string, finalTok fence.Token, unguarded bool) (note, newer string) {
	why := "only because no newer token had reached it"
	if unguarded {
		why = "without any check"
	}
	s := fmt.Sprintf("%s ACCEPTED %s's write (token %d) %s, %s", store, w.Role, w.Token, lostPhrase(w), why)
	if w.newer != nil {
		newer = w.newer.role
	}
	if newest != nil && newest.Token > w.Token && finalBy == newest.Role && finalTok == newest.Token {
		s += fmt.Sprintf("; %s's write replaced it", newest.Role)
		if d := newest.At.Sub(w.At); d > 0 {
			s += " " + ms(d) + " later"
		}
		return s + ".", newest.Role
	}
	return s + "; nothing newer replaced it.", newer
}

// acceptedBefore returns an accepted write with a greater token than w's
// that the store answered before w was sent (so it certainly came first),
// or nil.
func acceptedBefore(writes []writeView, w *writeView) *writeView {
	for i := range writes {
		if v := &writes[i]; v.Outcome == outcomeAccepted && v.Token > w.Token && v.At.Before(w.Sent) {
			return v
		}
	}
	return nil
}

// acceptedWith returns the accepted write with token current, as a stale
// rejection names it, or (when the store did not say) one with a greater
// token than presented; nil if there is none.
func acceptedWith(writes []writeView, current, presented fence.Token) *writeView {
	var any *writeView
	for i := range writes {
		v := &writes[i]
		if v.Outcome != outcomeAccepted || v.Token <= presented {
			continue
		}
		if v.Token == current {
			return v
		}
		any = v
	}
	if current != 0 {
		return nil
	}
	return any
}

// lostPhrase says how the writer's lease had ended when it sent w.
func lostPhrase(w *writeView) string {
	if w.newer != nil {
		return fmt.Sprintf("%s after its lease ended (%s held token %d)", ms(w.Sent.Sub(w.lostAt)), w.newer.role, w.newer.token)
	}
	return fmt.Sprintf("%s after its lease's deadline", ms(w.Sent.Sub(w.lostAt)))
}

// firstLine returns s up to its first line break, cut to at most n bytes.
func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n-3] + "..."
	}
	return s
}

func ms(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return d.Round(time.Millisecond).String()
}

func orElse(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func indent(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = "  " + l
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return fmt.Sprintf(many, n)
}

// frozen is how long the orchestrator froze A, and how long A's lease had
// left when it last checked it before the freeze.
type frozen struct{ pause, remaining time.Duration }

func freeze(events []event) (frozen, bool) {
	var f frozen
	var froze, resumed time.Time
	for _, e := range events {
		switch {
		case e.Kind == evChecked && e.Role == "A":
			f.remaining = e.Remaining
		case e.Kind == evFroze:
			froze = e.At
		case e.Kind == evResumed:
			resumed = e.At
		}
	}
	if froze.IsZero() || resumed.IsZero() {
		return f, false
	}
	f.pause = resumed.Sub(froze)
	return f, true
}

// cmpStore names the row's store: postgres unless --row-store said otherwise.
func cmpStore(s string) string {
	if s == "" {
		return "postgres"
	}
	return s
}
