package redislease

// ClientForTest returns the backend's client.
func (b *Backend) ClientForTest() Client { return b.c }

// PrefixForTest returns the backend's key prefix.
func (b *Backend) PrefixForTest() string { return b.prefix }
