package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlags checks the flags' bounds, that every problem is reported at
// once, and that usage and errors go to stderr while --help goes to stdout.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string // must contain; an empty stdout means stdout must be empty
	}{
		{[]string{"--help"}, 0, "Usage: go run ./examples/riverjob", ""},
		{[]string{"--rescue-after", "100ms"}, 2, "", "--rescue-after 100ms: must be from 500ms to 1m0s"},
		{[]string{"--rescue-after", "2m", "--write-delay", "1ms"}, 2, "", "--write-delay 1ms: must be from 50ms"},
		{[]string{"--rescue-after", "2m", "--write-delay", "1ms"}, 2, "", "--rescue-after 2m0s"},
		{[]string{"extra"}, 2, "", "unexpected arguments"},
		{[]string{"--nope"}, 2, "", "Usage: go run ./examples/riverjob"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		okOut := strings.Contains(stdout.String(), tc.stdout) && (tc.stdout != "" || stdout.Len() == 0)
		if code != tc.code || !okOut || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d, stdout %q, stderr with %q",
				tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}
