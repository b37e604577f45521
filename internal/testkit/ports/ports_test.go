package ports

import "testing"

// Every port Loopback hands out in a process is new: 300 draws from the
// process's window of 1,000 would repeat one almost surely if a port
// could be handed out twice (two members of one etcd cluster on one port
// made the cluster refuse to start).
func TestLoopbackNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p := Loopback(t)
		if seen[p] {
			t.Fatalf("Loopback handed out %d twice", p)
		}
		seen[p] = true
	}
}
