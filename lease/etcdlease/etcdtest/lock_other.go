//go:build !unix

package etcdtest

// lockFile locks nothing here: test processes that build the member
// program at once may each link it (the rename that ends a failed
// overwrite keeps every copy whole).
func lockFile(string) (unlock func(), err error) { return func() {}, nil }
