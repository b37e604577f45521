package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, 0, "Usage: go run ./examples/stalewriter"},
		{[]string{"--ttl", "5ms"}, 2, "--ttl 5ms: must be a whole number of milliseconds, at least 100ms"},
		{[]string{"--ttl", "1500us"}, 2, "--ttl 1.5ms"},
		{[]string{"--pause", "-1s", "--write-delay", "1ms"}, 2, "--pause -1s: must be positive"},
		{[]string{"--write-delay", "1ms"}, 2, "--write-delay 1ms"},
		{[]string{"extra"}, 2, "unexpected arguments"},
		{[]string{"--nope"}, 2, "flag provided but not defined"},
	} {
		var out bytes.Buffer
		if code := run(tc.args, &out); code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%q) = %d with %q; want %d mentioning %q", tc.args, code, out.String(), tc.code, tc.want)
		}
	}
}
