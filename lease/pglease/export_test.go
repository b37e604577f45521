package pglease

// PinnedPIDsForTest returns the server processes of the backend's pinned
// session-mode connections.
func (b *Backend) PinnedPIDsForTest() []uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	pids := make([]uint32, 0, len(b.pins))
	for p := range b.pins {
		pids = append(pids, p.pid)
	}
	return pids
}

// LockKeyForTest returns session mode's advisory lock key for name.
func (b *Backend) LockKeyForTest(name string) int64 { return lockKey(b.o.Schema, name) }
