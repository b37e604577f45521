// Package jobnames bounds the lease names that the job gauges of packages
// leaseprom and leaseotel are labelled by: the first Max names a process
// reports keep a series each, and every later one is counted in one series
// labelled Other. A gauge labelled by lease name is meant for the few jobs
// a program names in its code; a program that runs a job under a lease per
// item (one per order, say) would otherwise add a series per item, for
// ever.
package jobnames

import "sync"

// Max is how many lease names get a series of their own.
const Max = 100

// Other labels the series that counts the jobs of every lease name beyond
// the first Max: empty, which no lease name is.
const Other = ""

// Names remembers which lease names have a series. The zero Names is ready
// to use; it is safe for concurrent use.
type Names struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// Label returns the label of name's series: name itself while it is one of
// the first Max names Label was given, Other for any later name. A name
// gets the same label every time, so that a job's end lands in the series
// its start did.
func (n *Names) Label(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.seen[name]; ok {
		return name
	}
	if len(n.seen) >= Max {
		return Other
	}
	if n.seen == nil {
		n.seen = make(map[string]struct{}, 8)
	}
	n.seen[name] = struct{}{}
	return name
}
