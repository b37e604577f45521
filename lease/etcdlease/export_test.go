package etcdlease

import "time"

// SetClock makes b read the time from now instead of time.Now: the send
// times and ages of its etcd leases, places and hand-overs, so that a test
// decides when they are old (virtual time for the Backend's own timing,
// against a real etcd). Call it before b is used.
func SetClock(b *Backend, now func() time.Time) { b.now = now }
