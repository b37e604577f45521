//go:build !unix

package ports

// reserve reserves nothing here: ports are only checked free.
func reserve(string, int) (bool, error) { return true, nil }
