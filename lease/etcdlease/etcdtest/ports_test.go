package etcdtest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every port freeURL hands out in a process is new: 300 draws from the
// process's window of 1,000 would repeat one almost surely if a port
// could be handed out twice (two members of one cluster on one port made
// the cluster refuse to start).
func TestFreeURLNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 300 {
		u := freeURL(t)
		if seen[u.Host] {
			t.Fatalf("freeURL handed out %s twice", u.Host)
		}
		seen[u.Host] = true
	}
}
