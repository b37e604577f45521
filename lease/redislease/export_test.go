package redislease

// ClientForTest returns the backend's client.
func (b *Backend) ClientForTest() Client { return b.c }

// PrefixForTest returns the backend's key prefix.
func (b *Backend) PrefixForTest() string { return b.prefix }

// ScriptSHAsForTest returns the SHA1 digests of the renew and release
// scripts, as EVALSHA sends them.
func ScriptSHAsForTest() (renew, release string) { return renewScript.Hash(), releaseScript.Hash() }
