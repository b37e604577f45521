package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
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
		{[]string{"--lease-store", "etcd"}, 2, `--lease-store "etcd": want redis, postgres or postgres-session`},
	} {
		var out bytes.Buffer
		if code := run(tc.args, &out); code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%q) = %d with %q; want %d mentioning %q", tc.args, code, out.String(), tc.code, tc.want)
		}
	}
}

func TestJudge(t *testing.T) {
	ev := func(role, store string, tok uint64, accepted bool, at int) event {
		return event{Role: role, Kind: evWrite, Store: store, Accepted: accepted, Token: fence.Token(tok),
			At: time.Unix(0, 0).Add(time.Duration(at) * time.Millisecond)}
	}
	final := finalState{RowWrittenBy: "B", RowToken: 2, RowLockVersion: 2, ObjectWrittenBy: "B", ObjectToken: 2}
	safe := &summary{Final: final, Events: []event{
		ev("B", "postgres", 2, true, 1), ev("B", "s3", 2, true, 2),
		ev("A", "postgres", 1, false, 3), ev("A", "s3", 1, false, 4),
	}}
	judge(safe)
	if !safe.OK || !strings.Contains(safe.Verdict, "rejected worker A's stale write") {
		t.Fatalf("safe run judged %v: %s", safe.OK, safe.Verdict)
	}
	overwritten := &summary{Unguarded: true, Final: finalState{RowWrittenBy: "A", RowToken: 1, ObjectWrittenBy: "A", ObjectToken: 1}, Events: []event{
		ev("B", "postgres", 2, true, 1), ev("B", "s3", 2, true, 2),
		ev("A", "postgres", 1, true, 3), ev("A", "s3", 1, true, 4),
	}}
	judge(overwritten)
	if overwritten.OK || !strings.Contains(overwritten.Verdict, "UNSAFE") || !strings.Contains(overwritten.Verdict, "update is lost") {
		t.Fatalf("overwritten run judged %v: %s", overwritten.OK, overwritten.Verdict)
	}
	inOrder := &summary{Final: final, Events: []event{
		ev("A", "postgres", 1, true, 1), ev("A", "s3", 1, true, 2),
		ev("B", "postgres", 2, true, 3), ev("B", "s3", 2, true, 4),
	}}
	judge(inOrder)
	if !inOrder.OK || !strings.Contains(inOrder.Verdict, "No stale write") {
		t.Fatalf("in-order run judged %v: %s", inOrder.OK, inOrder.Verdict)
	}
}
