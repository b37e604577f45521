package reliability

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fencekit/fencekit/fence"
)

// outcome is what a write's caller learned.
type outcome int

const (
	outOK       outcome = iota // applied
	outStale                   // rejected: a newer token was stored (fence.ErrStaleToken)
	outNotFound                // nothing written: no such row
	outExists                  // nothing written: the row exists (Insert)
	outConflict                // nothing written: the object is not the version read (PutIf)
	outNoChange                // nothing written, for a reason the model does not order (retryable, contention)
	outFailed                  // a plain error: the guard says nothing was, or will be, applied
	outUnknown                 // fence.ErrOutcomeUnknown: may be applied, now or later
	outRead                    // a read's result
)

func (o outcome) String() string {
	return [...]string{"ok", "stale", "not-found", "exists", "conflict", "no-change", "failed", "unknown", "read"}[o]
}

// result is an operation's output as recorded for the checker.
type result struct {
	Outcome outcome
	// Current is the stored token a stale rejection reported (0 when the
	// guard could not learn it).
	Current uint64
	// For reads, and for the version a blob write returned.
	Exists  bool
	Deleted bool
	Value   string
	Token   uint64
	ETag    string
	// Err is the error text, for reports only.
	Err string
}

// history records the operations of one run. Times are nanoseconds on the
// test process's monotonic clock; an operation whose outcome is unknown
// has its return at infinity: it may take effect at any time after its
// call, or never.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func newHistory() *history { return &history{start: time.Now()} }

// now returns the time for a call or return.
func (h *history) now() int64 { return int64(time.Since(h.start)) }

// add records one operation.
func (h *history) add(client int, in any, call int64, out result, ret int64) {
	if out.Outcome == outUnknown {
		ret = math.MaxInt64
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// counts returns how many operations had each outcome.
func (h *history) counts() map[outcome]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := map[outcome]int{}
	for _, op := range h.ops {
		m[op.Output.(result).Outcome]++
	}
	return m
}

// check checks the history against model and fails the test, with the
// offending partition's operations, when it is not linearizable. A check
// that runs out of time fails too: it proved nothing.
func (h *history) check(t *testing.T, model porcupine.Model, what string) {
	t.Helper()
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 2*time.Minute)
	switch res {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		t.Fatalf("%s: the linearizability check of %d operations timed out: nothing was proved", what, len(ops))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: NOT linearizable (%d operations). ", what, len(ops))
	if dir := os.Getenv("RELIABILITY_VIS_DIR"); dir != "" {
		f, err := os.CreateTemp(dir, "history-*.html")
		if err == nil {
			_ = porcupine.Visualize(model, info, f)
			_ = f.Close()
			fmt.Fprintf(&b, "visualization: %s. ", f.Name())
		}
	}
	// For the first partition that does not linearize: the longest
	// partial linearization's last steps, the states they lead to, and the
	// operations it could not take next (the one that returns first is
	// where every order failed).
	for _, lins := range info.PartialLinearizationsOperations() {
		var longest []porcupine.Operation
		total := 0
		for _, l := range lins {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(lins) == 0 {
			continue
		}
		// The partition's size: the operations of the first linearization's keys.
		in := map[porcupine.Operation]bool{}
		for _, op := range longest {
			in[op] = true
		}
		part := partitionOf(model, ops, longest)
		total = len(part)
		if len(longest) == total {
			continue
		}
		state := model.Init()
		for _, op := range longest {
			_, state = model.Step(state, op.Input, op.Output)
		}
		fmt.Fprintf(&b, "\nlongest partial linearization: %d of %d operations; its last steps:", len(longest), total)
		for _, op := range longest[max(0, len(longest)-8):] {
			fmt.Fprintf(&b, "\n  %s", describeOp(model, op))
		}
		fmt.Fprintf(&b, "\nstates after them: %s\nnot linearized (in return order):", model.DescribeState(state))
		var rest []porcupine.Operation
		for _, op := range part {
			if !in[op] {
				rest = append(rest, op)
			}
		}
		sort.Slice(rest, func(a, c int) bool { return rest[a].Return < rest[c].Return })
		for _, op := range rest[:min(len(rest), 12)] {
			fmt.Fprintf(&b, "\n  %s", describeOp(model, op))
		}
		break
	}
	t.Fatal(b.String())
}

// partitionOf returns the partition of ops that holds the operations of lin.
func partitionOf(model porcupine.Model, ops []porcupine.Operation, lin []porcupine.Operation) []porcupine.Operation {
	if len(lin) == 0 {
		return nil
	}
	for _, p := range model.Partition(ops) {
		for _, op := range p {
			if op == lin[0] {
				return p
			}
		}
	}
	return nil
}

func describeOp(model porcupine.Model, op porcupine.Operation) string {
	ret := "inf"
	if op.Return != math.MaxInt64 {
		ret = time.Duration(op.Return).String()
	}
	return fmt.Sprintf("c%d [%v, %s] %s", op.ClientId, time.Duration(op.Call), ret, model.DescribeOperation(op.Input, op.Output))
}

// classify turns a guard's error into an outcome. The order matters: an
// error may match several sentinels (an unknown outcome joined with a
// stale token found afterwards is still unknown).
func classify(err error, extra func(error) (outcome, bool)) result {
	if err == nil {
		return result{Outcome: outOK}
	}
	r := result{Err: err.Error()}
	switch {
	case errors.Is(err, fence.ErrOutcomeUnknown):
		r.Outcome = outUnknown
	case errors.Is(err, fence.ErrStaleToken):
		r.Outcome = outStale
		if se, ok := fence.AsStale(err); ok {
			r.Current = uint64(se.Current)
		}
	default:
		r.Outcome = outFailed
		if extra != nil {
			if o, ok := extra(err); ok {
				r.Outcome = o
			}
		}
	}
	return r
}

// figures are the numbers one check reports for docs/reliability.md.
type figures struct {
	Check      string         `json:"check"`
	Operations int            `json:"operations"`
	Outcomes   map[string]int `json:"outcomes"`
	Faults     map[string]int `json:"faults"`
	Trials     int            `json:"trials,omitempty"`
	Violations int            `json:"violations"`
	Seed       uint64         `json:"seed,omitempty"`
	Seconds    float64        `json:"seconds"`
}

// faultCounter counts injected faults by kind; safe for concurrent use.
type faultCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (f *faultCounter) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]int{}
	}
	f.m[kind]++
}

func (f *faultCounter) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{} // not nil: the figures say "faults": {}
	maps.Copy(out, f.m)
	return out
}

func (f *faultCounter) total() int {
	n := 0
	for _, v := range f.snapshot() {
		n += v
	}
	return n
}

var figuresMu sync.Mutex

// report logs a check's figures and, when RELIABILITY_FIGURES names a file,
// appends them to it as one JSON line (scripts/soak.sh and the doc's table
// read them).
func report(t *testing.T, f figures) {
	t.Helper()
	b, _ := json.Marshal(f)
	t.Logf("FIGURES %s", b)
	path := os.Getenv("RELIABILITY_FIGURES")
	if path == "" {
		return
	}
	figuresMu.Lock()
	defer figuresMu.Unlock()
	fh, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("RELIABILITY_FIGURES: %v", err)
		return
	}
	defer fh.Close()
	_, _ = fh.Write(append(b, '\n'))
}

// historyFigures builds the figures of a history check.
func historyFigures(check string, h *history, faults *faultCounter, started time.Time) figures {
	f := figures{Check: check, Outcomes: map[string]int{}, Faults: faults.snapshot(), Seconds: time.Since(started).Seconds()}
	for o, n := range h.counts() {
		f.Outcomes[o.String()] = n
		f.Operations += n
	}
	return f
}

// tokenSource hands out tokens the way a sequence of lease holders would,
// with stale holders mixed in: most operations present the newest token
// issued so far or a new one, some an older one.
type tokenSource struct{ newest atomic.Uint64 }

// next returns a token for an operation, using r (a per-worker random
// source) to choose between a new token, the newest and an older one.
func (s *tokenSource) next(r interface{ IntN(int) int }) uint64 {
	switch n := r.IntN(10); {
	case n < 3:
		return s.newest.Add(1)
	case n < 7:
		return max(s.newest.Load(), 1)
	default:
		cur := s.newest.Load()
		back := uint64(r.IntN(4) + 1)
		if cur <= back {
			return 1
		}
		return cur - back
	}
}

// holder hands out tokens as one lease holder would see them: only tokens
// it was granted (minted from the shared source, so each belongs to one
// holder), mostly its newest, sometimes an older one of its own, and now
// and then a new grant. Other holders' grants make its tokens stale.
type holder struct {
	src  *tokenSource
	mine []uint64
}

// grant mints a new token for the holder: greater than every token
// minted before.
func (h *holder) grant() uint64 {
	t := h.src.newest.Add(1)
	h.mine = append(h.mine, t)
	return t
}

func (h *holder) next(r interface{ IntN(int) int }) uint64 {
	switch n := r.IntN(10); {
	case n < 3 || len(h.mine) == 0:
		return h.grant()
	case n < 8:
		return h.mine[len(h.mine)-1]
	default:
		return h.mine[max(0, len(h.mine)-1-r.IntN(4))]
	}
}
