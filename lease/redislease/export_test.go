package redislease

import "time"

// ClientForTest returns the backend's client.
func (b *Backend) ClientForTest() Client { return b.c }

// EndedKeyForTest returns the key of owner's tombstone for name.
func (b *Backend) EndedKeyForTest(name, owner string) string { return b.endedKey(name, owner) }

// PrefixForTest returns the backend's key prefix.
func (b *Backend) PrefixForTest() string { return b.prefix }

// ScriptSHAsForTest returns the SHA1 digests of the renew and release
// scripts (the release script's default form: sharded notices), as EVALSHA
// sends them.
func ScriptSHAsForTest() (renew, release string) {
	return renewScript.Hash(), releaseScripts[sharded].Hash()
}

// SlotOf gives the tests the hash slot function of the sharded hub.
var SlotOf = slotOf

// SetConfirmTimeoutForTest sets how long a waiter waits for a subscription
// to be confirmed, and returns a function that restores it.
func SetConfirmTimeoutForTest(d time.Duration) (restore func()) {
	old := confirmTimeout
	confirmTimeout = d
	return func() { confirmTimeout = old }
}

// PubSubKind reports what the hub resolved to: "sharded, per slot",
// "sharded", "classic", or "" before the first Watch.
func (b *Backend) PubSubKind() string {
	b.hub.mu.Lock()
	defer b.hub.mu.Unlock()
	switch {
	case !b.hub.resolved:
		return ""
	case b.hub.perSlot:
		return "sharded, per slot"
	case b.hub.sharded:
		return "sharded"
	}
	return "classic"
}

// PubSubConns returns how many pub/sub connections the hub has open.
func (b *Backend) PubSubConns() int {
	b.hub.mu.Lock()
	defer b.hub.mu.Unlock()
	return len(b.hub.conns)
}
