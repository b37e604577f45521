package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Tokens as the Redis backend mints them: microseconds of the server clock.
const (
	tokA fence.Token = 1764582012345678
	tokB fence.Token = 1764582014351234
)

// timeline builds the events of one run, times in milliseconds since the
// start.
type timeline struct {
	t0     time.Time
	events []event
}

func newTimeline() *timeline { return &timeline{t0: time.Unix(1764582012, 0)} }

func (tl *timeline) at(ms int) time.Time { return tl.t0.Add(time.Duration(ms) * time.Millisecond) }

func (tl *timeline) acquired(role string, tok fence.Token, ms int) *timeline {
	tl.events = append(tl.events, event{Role: role, Kind: evAcquired, Token: tok, At: tl.at(ms)})
	return tl
}

func (tl *timeline) checked(role string, remaining time.Duration, ms int) *timeline {
	tl.events = append(tl.events, event{Role: role, Kind: evChecked, Remaining: remaining, At: tl.at(ms)})
	return tl
}

func (tl *timeline) froze(ms int) *timeline {
	tl.events = append(tl.events, event{Role: "orchestrator", Kind: evFroze, At: tl.at(ms)})
	return tl
}

func (tl *timeline) resumed(ms int) *timeline {
	tl.events = append(tl.events, event{Role: "orchestrator", Kind: evResumed, At: tl.at(ms)})
	return tl
}

// write adds a write attempt sent at sentMs and answered 5 ms later, by a
// writer whose lease deadline was deadlineMs (negative: unknown).
func (tl *timeline) write(role, store string, tok fence.Token, outcome string, sentMs, deadlineMs int) *timeline {
	e := event{Role: role, Kind: evWrite, Store: store, Token: tok, Outcome: outcome,
		Accepted: outcome == outcomeAccepted, Sent: tl.at(sentMs), At: tl.at(sentMs + 5)}
	if deadlineMs >= 0 {
		e.Deadline = tl.at(deadlineMs)
	}
	switch outcome {
	case outcomeFailed:
		e.Error = "sqlguard: begin: connection reset by peer"
	case outcomeStale:
		e.Current = tokB // the only newer token in these timelines
	}
	tl.events = append(tl.events, e)
	return tl
}

func (tl *timeline) lost(role string, ms int) *timeline {
	tl.events = append(tl.events, event{Role: role, Kind: evLost, At: tl.at(ms)})
	return tl
}

func finalBy(role string, tok fence.Token) finalState {
	return finalState{RowWrittenBy: role, RowToken: tok, RowLockVersion: int64(tok), ObjectWrittenBy: role, ObjectToken: tok}
}

// verdictCase is a run's events and final state, and what its verdict must
// say.
type verdictCase struct {
	name      string
	events    []event
	final     finalState
	unguarded bool
	ok        bool
	// inconclusive is the run that showed nothing.
	inconclusive bool
	// want are phrases the verdict must contain, headline first.
	want []string
	// not are phrases it must not contain.
	not []string
}

// verdictCases are the timelines the verdict must tell apart.
var verdictCases = []verdictCase{
	{
		// --pause 2100ms (TTL 2s): B acquires at 2.0s; A resumes at
		// 2.1s and writes both stores before B's first write lands
		// (B's first connection is slow): both accepted by order.
		name: "pause 2100ms: A writes after B acquired, before B writes",
		events: newTimeline().acquired("A", tokA, 0).checked("A", 1900*time.Millisecond, 1).froze(2).
			acquired("B", tokB, 2001).resumed(2102).
			write("A", "postgres", tokA, outcomeAccepted, 2103, 1900).
			write("A", "s3", tokA, outcomeAccepted, 2110, 1900).lost("A", 2115).
			write("B", "postgres", tokB, outcomeAccepted, 2160, 3900).
			write("B", "s3", tokB, outcomeAccepted, 2170, 3900).events,
		final: finalBy("B", tokB), ok: true,
		want: []string{"VERDICT: SAFE, BY TOKEN ORDER: A wrote after losing its lease, and was accepted only because B had not written yet.",
			"postgres ACCEPTED A's write (token 1764582012345678) 203ms after its lease ended (B held token 1764582014351234), only because no newer token had reached it; B's write replaced it 57ms later.",
			"s3 ACCEPTED A's write", "cannot stop a stale write that arrives before the newer one"},
		not: []string{"No stale write", "kept its lease", "REJECTED"},
	},
	{
		// --pause 2s: B's row write wins the race, A's object write
		// wins the other; one rejection, one acceptance by order.
		name: "pause 2s: one store rejects A, the other accepts A before B",
		events: newTimeline().acquired("A", tokA, 0).checked("A", 1900*time.Millisecond, 1).froze(2).
			acquired("B", tokB, 1998).write("B", "postgres", tokB, outcomeAccepted, 2000, 3900).
			resumed(2002).
			write("A", "postgres", tokA, outcomeStale, 2004, 1900).
			write("A", "s3", tokA, outcomeAccepted, 2012, 1900).
			write("B", "s3", tokB, outcomeAccepted, 2020, 3900).events,
		final: finalBy("B", tokB), ok: true,
		want: []string{"VERDICT: SAFE, BY TOKEN ORDER",
			"postgres REJECTED A's write (token 1764582012345678) 104ms after its lease ended (B held token 1764582014351234): B's write had reached it first.",
			"s3 ACCEPTED A's write (token 1764582012345678) 112ms after its lease ended", "B's write replaced it"},
		not: []string{"No stale write"},
	},
	{
		// --ttl 100ms --pause 150ms: A's deadline passed while it was
		// frozen, and B had not acquired yet when A wrote.
		name: "ttl 100ms pause 150ms: A writes past its deadline before B acquires",
		events: newTimeline().acquired("A", tokA, 0).checked("A", 90*time.Millisecond, 1).froze(2).
			resumed(152).
			write("A", "postgres", tokA, outcomeAccepted, 153, 90).
			write("A", "s3", tokA, outcomeAccepted, 160, 90).
			acquired("B", tokB, 170).
			write("B", "postgres", tokB, outcomeAccepted, 172, 260).
			write("B", "s3", tokB, outcomeAccepted, 180, 260).events,
		final: finalBy("B", tokB), ok: true,
		want: []string{"VERDICT: SAFE, BY TOKEN ORDER",
			"postgres ACCEPTED A's write (token 1764582012345678) 63ms after its lease's deadline, only because no newer token had reached it"},
		not: []string{"No stale write"},
	},
	{
		// --ttl 1s --pause 1.3s, seen in the integration tests: A
		// resumes and sends both writes just before B sends its own
		// (B spent its write delay), yet B's row commits first (A's
		// transaction waits for B's lock) and A's object lands first
		// (the two PUTs overlap). Send order is not the store's order.
		name: "ttl 1s pause 1.3s: writes in flight together, send order is not the store's",
		events: newTimeline().acquired("A", tokA, 0).checked("A", 980*time.Millisecond, 1).froze(2).
			acquired("B", tokB, 1002).resumed(1302).
			write("A", "postgres", tokA, outcomeStale, 1303, 980).
			write("B", "postgres", tokB, outcomeAccepted, 1304, 1990).
			write("A", "s3", tokA, outcomeAccepted, 1314, 980).
			write("B", "s3", tokB, outcomeAccepted, 1316, 1990).events,
		final: finalBy("B", tokB), ok: true,
		want: []string{"VERDICT: SAFE, BY TOKEN ORDER: A wrote after losing its lease, and was accepted only because B had not written yet.",
			"postgres REJECTED A's write (token 1764582012345678) 323ms after its lease ended (B held token 1764582014351234): B's write had reached it first.",
			"s3 ACCEPTED A's write (token 1764582012345678) 334ms after its lease ended (B held token 1764582014351234), only because no newer token had reached it; B's write replaced it 2ms later."},
		not: []string{"UNSAFE", "NOT SHOWN"},
	},
	{
		name: "short pause: A keeps its lease and writes first",
		events: newTimeline().acquired("A", tokA, 0).checked("A", 1900*time.Millisecond, 1).froze(2).
			resumed(502).
			write("A", "postgres", tokA, outcomeAccepted, 503, 1900).
			write("A", "s3", tokA, outcomeAccepted, 510, 1900).
			acquired("B", tokB, 520).
			write("B", "postgres", tokB, outcomeAccepted, 522, 2420).
			write("B", "s3", tokB, outcomeAccepted, 530, 2420).events,
		final: finalBy("B", tokB), ok: true,
		want: []string{"VERDICT: SAFE. No stale write was attempted", "A was frozen for 500ms and its lease had 1.9s left, so it kept its lease"},
		not:  []string{"REJECTED", "ACCEPTED"},
	},
	{
		name: "B writes, then A's stale writes are rejected",
		events: newTimeline().acquired("A", tokA, 0).checked("A", 1900*time.Millisecond, 1).froze(2).
			acquired("B", tokB, 2000).
			write("B", "postgres", tokB, outcomeAccepted, 2010, 3900).
			write("B", "s3", tokB, outcomeAccepted, 2020, 3900).
			resumed(5002).
			write("A", "postgres", tokA, outcomeStale, 5003, 1900).
			write("A", "s3", tokA, outcomeStale, 5010, 1900).lost("A", 5012).events,
		final: finalBy("B", tokB), ok: true,
		want: []string{"VERDICT: SAFE. The stores rejected all 2 writes A made after losing its lease; the newest token's data survived.",
			"postgres REJECTED A's write (token 1764582012345678) 3.103s after its lease ended (B held token 1764582014351234): B's write had reached it first.",
			"s3 REJECTED"},
		not: []string{"ACCEPTED", "No stale write"},
	},
	{
		name:      "unguarded: A's late writes overwrite B's",
		unguarded: true,
		events: newTimeline().acquired("A", tokA, 0).checked("A", 1900*time.Millisecond, 1).froze(2).
			acquired("B", tokB, 2000).
			write("B", "postgres", tokB, outcomeAccepted, 2010, 3900).
			write("B", "s3", tokB, outcomeAccepted, 2020, 3900).
			resumed(5002).
			write("A", "postgres", tokA, outcomeAccepted, 5003, 1900).
			write("A", "s3", tokA, outcomeAccepted, 5010, 1900).events,
		final: finalState{RowWrittenBy: "A", RowToken: tokA, ObjectWrittenBy: "A", ObjectToken: tokA},
		ok:    false,
		want: []string{"VERDICT: UNSAFE.",
			"postgres ACCEPTED A's write with stale token 1764582012345678 after B's with token 1764582014351234: B's update is lost.",
			"s3 ACCEPTED A's write with stale token", "Run without --unguarded"},
		not: []string{"VERDICT: SAFE"},
	},
	{
		name:      "unguarded: A's late writes land before B's, by luck",
		unguarded: true,
		events: newTimeline().acquired("A", tokA, 0).froze(2).acquired("B", tokB, 2000).resumed(2002).
			write("A", "postgres", tokA, outcomeAccepted, 2003, 1900).
			write("A", "s3", tokA, outcomeAccepted, 2010, 1900).
			write("B", "postgres", tokB, outcomeAccepted, 2050, 3900).
			write("B", "s3", tokB, outcomeAccepted, 2060, 3900).events,
		final: finalState{RowWrittenBy: "B", RowToken: tokB, ObjectWrittenBy: "B", ObjectToken: tokB},
		ok:    true,
		want:  []string{"VERDICT: NO OVERWRITE THIS TIME, by luck of timing alone", "postgres ACCEPTED A's write", "without any check"},
		not:   []string{"SAFE"},
	},
	{
		name: "guarded, but the final row is not the newest token's",
		events: newTimeline().acquired("A", tokA, 0).froze(2).acquired("B", tokB, 2000).
			write("B", "postgres", tokB, outcomeAccepted, 2010, 3900).
			write("B", "s3", tokB, outcomeAccepted, 2020, 3900).resumed(5002).
			write("A", "postgres", tokA, outcomeStale, 5003, 1900).
			write("A", "s3", tokA, outcomeStale, 5010, 1900).events,
		final: finalState{RowWrittenBy: "A", RowToken: tokA, RowLockVersion: int64(tokA), ObjectWrittenBy: "B", ObjectToken: tokB},
		ok:    false,
		want:  []string{"VERDICT: UNSAFE.", "postgres holds A's data (token 1764582012345678), not that of the newest accepted token 1764582014351234 (B)."},
	},
	{
		name: "a write fails for another reason: the run shows nothing",
		events: newTimeline().acquired("A", tokA, 0).froze(2).acquired("B", tokB, 2000).
			write("B", "postgres", tokB, outcomeFailed, 2010, 3900).
			write("B", "s3", tokB, outcomeAccepted, 2020, 3900).resumed(5002).
			write("A", "postgres", tokA, outcomeAccepted, 5003, 1900).
			write("A", "s3", tokA, outcomeStale, 5010, 1900).events,
		final: finalState{RowWrittenBy: "A", RowToken: tokA, RowLockVersion: int64(tokA), ObjectWrittenBy: "B", ObjectToken: tokB},
		ok:    false, inconclusive: true,
		want: []string{"VERDICT: NOT SHOWN", "postgres: B's write (token 1764582014351234) FAILED: sqlguard: begin: connection reset by peer",
			"postgres ACCEPTED A's write (token 1764582012345678) 3.103s after its lease ended (B held token 1764582014351234), only because no newer token had reached it; nothing newer replaced it."},
	},
}

func TestVerdictFromTimelines(t *testing.T) {
	for _, tc := range verdictCases {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, judge(tc.events, tc.final, tc.unguarded))
		})
	}
}

// check checks the verdict v of the case's run.
func (tc verdictCase) check(t *testing.T, v verdict) {
	t.Helper()
	text := v.String()
	if v.OK != tc.ok || v.Inconclusive != tc.inconclusive {
		t.Errorf("OK %v, inconclusive %v; want %v, %v", v.OK, v.Inconclusive, tc.ok, tc.inconclusive)
	}
	if len(tc.want) > 0 && !strings.HasPrefix(v.Lines[0], tc.want[0]) {
		t.Errorf("headline %q; want it to start with %q", v.Lines[0], tc.want[0])
	}
	for _, w := range tc.want {
		if !strings.Contains(text, w) {
			t.Errorf("verdict lacks %q", w)
		}
	}
	for _, n := range tc.not {
		if strings.Contains(text, n) {
			t.Errorf("verdict contains %q", n)
		}
	}
	for _, l := range v.Lines {
		if len(l) > 200 {
			t.Errorf("line of %d characters (want at most 200): %s", len(l), l)
		}
	}
	if t.Failed() {
		t.Logf("verdict:\n%s", text)
	}
}
