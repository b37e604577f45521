package integration

import (
	"strings"
	"testing"
)

// TestPausedClientDownstream runs the paused-client scenario with the
// workers also calling an HTTP service of the demo's own (--downstream):
// the token travels in the Fencing-Token header, and the service rejects
// the frozen holder's late call itself, with the stale token and B's. The
// unguarded run shows the check can fail: the service, checking nothing,
// takes A's late report over B's.
func TestPausedClientDownstream(t *testing.T) {
	for _, unguarded := range []bool{false, true} {
		args := []string{"--ttl", "1s", "--pause", "2500ms", "--resume-after-b", "--downstream"}
		if unguarded {
			args = append(args, "--unguarded")
		}
		code, sum, out := runDemo(t, args...)
		var a, b []bool // the service's answers to A's and B's calls: accepted?
		for _, e := range sum.Events {
			if e.Kind == "write" && e.Store == "service" {
				switch e.Role {
				case "A":
					a = append(a, e.Accepted)
				case "B":
					b = append(b, e.Accepted)
				}
			}
		}
		if len(a) != 1 || len(b) != 1 || !b[0] {
			t.Fatalf("unguarded=%v: the service's answers: A %v, B %v; want one call each, B's accepted\n%s", unguarded, a, b, out)
		}
		switch {
		case !unguarded && (code != 0 || !sum.OK || a[0] || !strings.Contains(out, "the service REJECTED A's call")):
			t.Fatalf("guarded: exit %d, ok=%v, A's late call accepted=%v; want 0, ok, rejected by the service\n%s", code, sum.OK, a[0], out)
		case unguarded && (code != 1 || sum.OK || !a[0] || !strings.Contains(out, "DOWNSTREAM: UNSAFE")):
			t.Fatalf("unguarded: exit %d, ok=%v, A's late call accepted=%v; want 1, not ok, accepted over B's\n%s", code, sum.OK, a[0], out)
		}
	}
}
