package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/lease/leasetest"
)

// The history of a verify run: what the workers did and saw, on one clock,
// as written to the JSON file and read back by --recheck. Times are
// nanoseconds since the run's start (Run.Started), read from the wall
// clock of the one machine that ran every worker (the run refuses to
// check a history during which that clock was stepped).

// historyFormat names the format of the JSON file; a change that an older
// --recheck cannot read changes it.
const historyFormat = "fencekit-verify/1"

type verifyHistory struct {
	Format string     `json:"format"`
	Run    runInfo    `json:"run"`
	Grants []grantRec `json:"grants"`
	Writes []writeRec `json:"writes"`
	Faults []faultRec `json:"faults"`
	// Initial is the scratch resource before the first write (it is
	// created empty); Final is what a read found after every worker had
	// exited (FinalError says why there is none).
	Initial    stateRec `json:"initial"`
	Final      stateRec `json:"final"`
	FinalError string   `json:"final_error,omitempty"`
}

type runInfo struct {
	ID       string    `json:"id"`
	Fencekit string    `json:"fencekit"`
	Started  time.Time `json:"started"`
	// DurationNS is how long the workers ran; the run asked for
	// RequestedNS.
	DurationNS  int64  `json:"duration_ns"`
	RequestedNS int64  `json:"requested_ns"`
	Store       string `json:"store"`
	StoreDesc   string `json:"store_desc"`
	Guard       string `json:"guard"`
	GuardDesc   string `json:"guard_desc"`
	Lease       string `json:"lease"`
	Resource    string `json:"resource"`
	// Scratch is the scratch resource the run created (and removed).
	Scratch scratch `json:"scratch"`
	TTLNS   int64   `json:"ttl_ns"`
	Workers int     `json:"workers"`
	Seed    uint64  `json:"seed"`
	// Faults lists the kinds of fault the run could inject.
	Faults []string `json:"faults"`
	// Plant names a bug planted in the workers (test equipment:
	// FENCEKIT_VERIFY_PLANT); empty in every real run.
	Plant string `json:"plant,omitempty"`
	// ClockDriftNS is how far the wall clock moved against the monotonic
	// clock during the run; Interrupted says the run was cut short.
	ClockDriftNS int64 `json:"clock_drift_ns"`
	Interrupted  bool  `json:"interrupted,omitempty"`
}

// grantRec is one grant a worker got.
type grantRec struct {
	Worker string      `json:"worker"`
	Token  fence.Token `json:"token"`
	// Acquired is when Acquire returned. LastValid is the start of the
	// worker's last reading of its lease that found it valid (-1: none),
	// and Deadline the lease's local deadline at that reading (0: none).
	Acquired  int64 `json:"acquired"`
	LastValid int64 `json:"last_valid"`
	Deadline  int64 `json:"deadline"`
	// Ended is when the grant ended for the worker (its Release returned,
	// it found the lease lost, or it was killed), and How says which.
	Ended int64  `json:"ended"`
	How   string `json:"how"`
	Err   string `json:"err,omitempty"`
}

// writeRec is one guarded write.
type writeRec struct {
	Worker string      `json:"worker"`
	Token  fence.Token `json:"token"`
	Value  string      `json:"value"`
	// Checked is the start of the reading of the lease, just before the
	// write, that found it valid.
	Checked int64 `json:"checked"`
	Call    int64 `json:"call"`
	Return  int64 `json:"return"`
	// Outcome is accepted, stale, unknown or failed (fence.Outcome);
	// Current is the newer token a stale write's error named.
	Outcome fence.Outcome `json:"outcome"`
	Current fence.Token   `json:"current,omitempty"`
	Err     string        `json:"err,omitempty"`
}

// faultRec is one fault the run injected.
type faultRec struct {
	Kind   string `json:"kind"`
	Worker string `json:"worker,omitempty"`
	Target string `json:"target,omitempty"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Detail string `json:"detail,omitempty"`
}

type stateRec struct {
	Token fence.Token `json:"token"`
	Value string      `json:"value"`
}

// Violation kinds, as the report and the summary name them.
const (
	vExclusion = "two holders at once"
	vTokens    = "token order"
	vDeadline  = "past its own deadline"
	vWrites    = "write accepted out of token order"
	vStale     = "stale answer inconsistent"
	vLost      = "acknowledged write lost"
	vMalformed = "malformed history"
)

// violation is one thing a check found, pointing at the grants and writes
// involved (indexes into verifyHistory.Grants and Writes).
type violation struct {
	Kind   string `json:"kind"`
	Text   string `json:"text"`
	Grants []int  `json:"grants,omitempty"`
	Writes []int  `json:"writes,omitempty"`
}

// verdict is what the checks found in a history.
type verdict struct {
	Windows    int
	Violations []violation
	// Inconclusive says why the history cannot be checked (the clock was
	// stepped, the final state could not be read); empty when it can.
	Inconclusive string
	Counts       verifyCounts
}

type verifyCounts struct {
	Grants, Writes, Accepted, Stale, Unknown, Failed int
	Faults                                           map[string]int
}

// maxClockDrift is how far the wall clock may move against the monotonic
// clock in a run before the history is refused: a clock slewed by NTP
// (at most 500 ppm) stays well inside it, a step does not.
func maxClockDrift(run time.Duration) time.Duration { return 20*time.Millisecond + run/1000 }

// check runs the toolkit's history checks on h: the lease windows
// (leasetest.CheckWindows: no two holders valid at once, tokens growing
// per grant, no holder valid past its own deadline) and the guarded writes
// (guardtest.Violations: accepted only in token order, stale answers that
// name a token that was stored, the final state holding the last
// acknowledged write).
func check(h *verifyHistory) verdict {
	var v verdict
	v.Counts = countHistory(h)
	switch d := time.Duration(h.Run.ClockDriftNS); {
	case d.Abs() > maxClockDrift(time.Duration(h.Run.DurationNS)):
		v.Inconclusive = fmt.Sprintf("the system clock was stepped by %v during the run: the workers' times cannot be compared; run again", d)
	case len(h.Grants) == 0:
		v.Inconclusive = "no worker was granted the lease: nothing was checked (the workers' errors are on the output)"
	case v.Counts.Accepted == 0:
		v.Inconclusive = "no write was accepted: the guarded writes were not checked (see the errors of the writes in the report)"
	}

	// The lease: one window per grant that was read valid.
	ws := make([]leasetest.Window, len(h.Grants))
	grantOf := map[leasetest.Window]int{}
	for i, g := range h.Grants {
		ws[i] = leasetest.Window{Name: h.Run.Lease, Holder: g.Worker + "#" + fmt.Sprint(i), Token: g.Token,
			Start: time.Duration(g.Acquired), End: time.Duration(g.LastValid), Deadline: time.Duration(g.Deadline)}
		if g.LastValid < 0 {
			ws[i].End = ws[i].Start - 1
		}
		grantOf[ws[i]] = i
	}
	wc := leasetest.CheckWindows(ws)
	v.Windows = wc.Windows
	for _, o := range wc.Overlaps {
		a, b := grantOf[o.First], grantOf[o.Second]
		v.add(violation{Kind: vExclusion, Grants: []int{a, b},
			Text: fmt.Sprintf("grant %s (worker %s, token %d) was granted at %s while grant %s (worker %s, token %d) was still valid: its holder read it valid until %s, %v later",
				gid(b), h.Grants[b].Worker, h.Grants[b].Token, at(h.Grants[b].Acquired), gid(a), h.Grants[a].Worker, h.Grants[a].Token, at(h.Grants[a].LastValid), o.By)})
	}
	for _, inv := range wc.Inversions {
		a, b := grantOf[inv.Earlier], grantOf[inv.Later]
		v.add(violation{Kind: vTokens, Grants: []int{b, a},
			Text: fmt.Sprintf("grant %s (worker %s) got token %d at %s, not greater than token %d of the earlier grant %s (worker %s)",
				gid(b), h.Grants[b].Worker, h.Grants[b].Token, at(h.Grants[b].Acquired), h.Grants[a].Token, gid(a), h.Grants[a].Worker)})
	}
	for _, w := range wc.PastDeadline {
		i := grantOf[w]
		v.add(violation{Kind: vDeadline, Grants: []int{i},
			Text: fmt.Sprintf("worker %s read grant %s (token %d) valid at %s, %v after its own deadline %s (the send time of its last confirmed request + TTL - margin)",
				h.Grants[i].Worker, gid(i), h.Grants[i].Token, at(h.Grants[i].LastValid), w.End-w.Deadline, at(h.Grants[i].Deadline))})
	}

	// The writes: one register, created empty.
	if h.FinalError != "" && v.Inconclusive == "" {
		v.Inconclusive = "the final state of the scratch resource could not be read (" + h.FinalError + "): whether an acknowledged write was lost is unknown"
	}
	gh := guardtest.History{Initial: h.Initial.Token, InitialValue: h.Initial.Value, Final: h.Final.Token, FinalValue: h.Final.Value}
	for _, w := range h.Writes {
		gh.Ops = append(gh.Ops, guardtest.Op{Token: w.Token, Value: w.Value, Call: time.Duration(w.Call), Return: time.Duration(w.Return), Outcome: w.Outcome, Current: w.Current})
	}
	for _, gv := range guardtest.Violations(gh) {
		kind := map[string]string{"a": vWrites, "b": vStale, "c": vLost, "": vMalformed}[gv.Rule]
		if kind == vLost && h.FinalError != "" {
			continue // the final state was not read: nothing to compare
		}
		v.add(violation{Kind: kind, Writes: gv.Ops, Text: renameOps(gv.Text)})
	}
	return v
}

func (v *verdict) add(x violation) { v.Violations = append(v.Violations, x) }

// gid and wid name a grant and a write in the report: g3, w12.
func gid(i int) string { return fmt.Sprintf("g%d", i) }
func wid(i int) string { return fmt.Sprintf("w%d", i) }

// at formats a time of the history (nanoseconds since the start).
func at(ns int64) string { return fmt.Sprintf("%.3fs", float64(ns)/1e9) }

// renameOps rewrites guardtest's "op N" as the report's write ids.
func renameOps(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "op ")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := i + 3
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		b.WriteString(s[:i])
		if j == i+3 {
			b.WriteString("op ")
		} else {
			b.WriteString("write w" + s[i+3:j])
		}
		s = s[j:]
	}
}

func countHistory(h *verifyHistory) verifyCounts {
	c := verifyCounts{Grants: len(h.Grants), Writes: len(h.Writes), Faults: map[string]int{}}
	for _, w := range h.Writes {
		switch w.Outcome {
		case fence.Accepted:
			c.Accepted++
		case fence.Rejected:
			c.Stale++
		case fence.Unknown:
			c.Unknown++
		default:
			c.Failed++
		}
	}
	for _, f := range h.Faults {
		c.Faults[f.Kind]++
	}
	return c
}

// sortHistory puts grants in the order they were granted and writes in the
// order they were called: the ids the report and the summary use.
func sortHistory(h *verifyHistory) {
	slices.SortStableFunc(h.Grants, func(a, b grantRec) int { return cmp.Compare(a.Acquired, b.Acquired) })
	slices.SortStableFunc(h.Writes, func(a, b writeRec) int { return cmp.Compare(a.Call, b.Call) })
	slices.SortStableFunc(h.Faults, func(a, b faultRec) int { return cmp.Compare(a.Start, b.Start) })
}

// errHistoryFormat is returned by readHistory for a file that is not a
// verify history.
var errHistoryFormat = errors.New("not a fencekit verify history")

// readHistory reads a history written by a run (--recheck).
func readHistory(path string) (*verifyHistory, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var h verifyHistory
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, errHistoryFormat, err)
	}
	if h.Format != historyFormat {
		return nil, fmt.Errorf("%s: %w (format %q, want %q)", path, errHistoryFormat, h.Format, historyFormat)
	}
	for i, w := range h.Writes {
		switch w.Outcome {
		case fence.Accepted, fence.Rejected, fence.Unknown, fence.Failed:
		default:
			return nil, fmt.Errorf("%s: write %d has outcome %q (accepted, stale, unknown or failed)", path, i, w.Outcome)
		}
	}
	return &h, nil
}
