package checktest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencecheck/checktest"
)

// broken is a checker with one defect, chosen by kind.
type broken struct {
	kind string
	mu   sync.Mutex
	m    map[string]fence.Token
}

func (b *broken) Check(ctx context.Context, r string, tok fence.Token) error {
	if err := fencecheck.ValidateResource(r, 100); err != nil {
		return err
	}
	if err := tok.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	cur := b.m[r]
	b.mu.Unlock()
	switch b.kind {
	case "accepts-all":
		cur = 0
	case "read-then-write": // the check and the update are two steps
		time.Sleep(time.Millisecond)
	}
	if tok < cur {
		return fence.Stale(r, tok, cur)
	}
	b.mu.Lock()
	b.m[r] = tok
	b.mu.Unlock()
	return nil
}

const kindVar = "FENCEKIT_CHECKTEST_BROKEN"

// TestSuiteCatchesBrokenCheckers runs the suite, in a child test process,
// against checkers that accept stale tokens or check and update in two
// steps, and requires it to fail them, naming the check that caught each.
func TestSuiteCatchesBrokenCheckers(t *testing.T) {
	if kind := os.Getenv(kindVar); kind != "" {
		checktest.Run(t, checktest.Config{
			New: func(t *testing.T) (fencecheck.Checker, func(context.Context, string) (fence.Token, error)) {
				b := &broken{kind: kind, m: map[string]fence.Token{}}
				return b, func(_ context.Context, r string) (fence.Token, error) {
					b.mu.Lock()
					defer b.mu.Unlock()
					return b.m[r], nil
				}
			},
			Checkers: 8, ChecksPerChecker: 30,
		})
		return
	}
	for kind, caughtBy := range map[string]string{
		"accepts-all":     "--- FAIL: TestSuiteCatchesBrokenCheckers/StaleIsRejected",
		"read-then-write": "--- FAIL: TestSuiteCatchesBrokenCheckers/ConcurrentChecksAreLinearizable",
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesBrokenCheckers$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), kindVar+"="+kind)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%s: the suite passed a broken checker:\n%s", kind, out)
		} else if !strings.Contains(string(out), caughtBy) {
			t.Errorf("%s: the suite failed, but not in the check that should catch it (%s):\n%s", kind, caughtBy, out)
		}
	}
}
