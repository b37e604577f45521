package zklease

import "fmt"

// SessionCredentials returns the server of the client's last connect
// response and the session's ID and password, so that tests can end the
// session at the store (zktest.ExpireSession).
func (b *Backend) SessionCredentials() (server string, id int64, passwd []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.server, b.session, append([]byte(nil), b.passwd...)
}

// Notified returns how many predecessor notifications woke a ticket of b.
func (b *Backend) Notified() int64 { return b.notified.Load() }

// DebugName describes b's state for name (tests' diagnostics).
func (b *Backend) DebugName(name string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ns := b.names[name]
	if ns == nil {
		return "no state"
	}
	s := fmt.Sprintf("ops %d subs %d", ns.ops, len(ns.subs))
	if t := ns.ticket; t != nil {
		s += fmt.Sprintf(" ticket %s predGone %v pred %s", t.path, t.predGone, t.pred)
	}
	for o, g := range ns.grants {
		s += fmt.Sprintf(" grant %s %s ended %v", o, g.path, g.ended)
	}
	return s
}
