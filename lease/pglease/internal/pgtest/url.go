package pgtest

import (
	"net"
	"strconv"
	"strings"
)

// WithHost returns url (a postgres:// URL) with its host and port
// replaced by addr (host:port), a proxy's.
func WithHost(url, addr string) string {
	at := strings.LastIndexByte(url, '@')
	rest := url[at+1:]
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	return url[:at+1] + addr + rest[end:]
}

// TargetOf returns the host:port of a postgres:// URL.
func TargetOf(url string) string {
	at := strings.LastIndexByte(url, '@')
	rest := url[at+1:]
	if end := strings.IndexAny(rest, "/?"); end >= 0 {
		rest = rest[:end]
	}
	if _, _, err := net.SplitHostPort(rest); err != nil {
		rest = net.JoinHostPort(rest, strconv.Itoa(5432))
	}
	return rest
}
