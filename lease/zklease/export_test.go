package zklease

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
