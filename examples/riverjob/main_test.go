package main

import (
	"testing"

	"github.com/fencekit/fencekit/internal/rig/demotest"
)

// TestFlags checks the flags' bounds, that every problem is reported at
// once, and that usage and errors go to stderr while --help goes to stdout.
func TestFlags(t *testing.T) {
	demotest.CheckFlags(t, run, []demotest.FlagCase{
		{[]string{"--help"}, 0, "Usage: go run ./examples/riverjob", ""},
		{[]string{"--rescue-after", "100ms"}, 2, "", "--rescue-after 100ms: must be from 500ms to 1m0s"},
		{[]string{"--rescue-after", "2m", "--write-delay", "1ms"}, 2, "", "--write-delay 1ms: must be from 50ms"},
		{[]string{"--rescue-after", "2m", "--write-delay", "1ms"}, 2, "", "--rescue-after 2m0s"},
		{[]string{"extra"}, 2, "", "unexpected arguments"},
		{[]string{"--nope"}, 2, "", "Usage: go run ./examples/riverjob"},
	})
}
