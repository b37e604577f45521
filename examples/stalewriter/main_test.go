package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/rig/services"

	"github.com/fencekit/fencekit/internal/rig/demotest"
)

// TestFlags checks the flags' bounds, that every problem is reported at
// once, and that usage and errors go to stderr while --help goes to stdout.
func TestFlags(t *testing.T) {
	demotest.CheckFlags(t, run, []demotest.FlagCase{
		{[]string{"--help"}, 0, "Usage: go run ./examples/stalewriter", ""},
		{[]string{"--ttl", "5ms"}, 2, "", "--ttl 5ms: must be a whole number of milliseconds, from 100ms to 1m0s"},
		{[]string{"--ttl", "1500us"}, 2, "", "--ttl 1.5ms"},
		{[]string{"--ttl", "1h"}, 2, "", "--ttl 1h0m0s: must be a whole number of milliseconds, from 100ms to 1m0s"},
		// Twice the TTL plus a second used to overflow into a negative
		// default pause.
		{[]string{"--ttl", "9223372036s"}, 2, "", "--ttl 2562047h47m16s: must be"},
		{[]string{"--pause", "11m"}, 2, "", "--pause 11m0s: must be positive and at most 10m0s"},
		{[]string{"--pause", "-1s", "--write-delay", "1ms"}, 2, "", "--write-delay 1ms: must be from 50ms"},
		{[]string{"--pause", "-1s", "--write-delay", "1ms"}, 2, "", "--pause -1s: must be positive"},
		{[]string{"--write-delay", "11s"}, 2, "", "--write-delay 11s: must be from 50ms (or A may write before it is frozen) to 10s"},
		{[]string{"extra"}, 2, "", "unexpected arguments"},
		{[]string{"--nope"}, 2, "", "flag provided but not defined"},
		{[]string{"--nope"}, 2, "", "Usage: go run ./examples/stalewriter"},
		{[]string{"--row-store", "oracle"}, 2, "", `--row-store "oracle": want postgres, mariadb or sqlite`},
		{[]string{"--lease-store", "consul"}, 2, "", `--lease-store "consul": want redis, postgres, postgres-session, etcd, zookeeper or dynamodb`},
		// etcd counts TTLs in whole seconds: refused before any service is
		// looked for.
		{[]string{"--lease-store", "etcd", "--ttl", "1500ms"}, 2, "", "--ttl 1.5s: etcd counts lease TTLs in whole seconds, from 1s"},
		{[]string{"--lease-store", "etcd", "--ttl", "500ms"}, 2, "", "--ttl 500ms: etcd counts lease TTLs in whole seconds"},
	})
}

// TestEtcdThatRaisesTheTTLIsRefused: an etcd whose election timeout is 3 s
// grants no lease shorter than 5 s; asked for 2 s it grants 5 s, and a run
// on it would keep a dead holder's lease 5 s while the timeline says 2 s.
// The demo refuses it before starting any worker, naming the TTL to use.
func TestEtcdThatRaisesTheTTLIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ep, stop, err := services.StartEtcd(ctx, 3000, t.Logf)
	if err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	defer stop()
	t.Setenv(services.EtcdEndpointsVar, ep)
	var stdout, stderr bytes.Buffer
	code := run([]string{"--lease-store", "etcd", "--ttl", "2s"}, &stdout, &stderr)
	want := "granted a lease of 5s when asked for the TTL 2s"
	if code != 2 || !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "choose --ttl 5s or more") {
		t.Fatalf("run = %d, stderr %q; want 2 and %q", code, stderr.String(), want)
	}
	if strings.Contains(stdout.String(), "started worker") {
		t.Fatalf("a worker was started:\n%s", stdout.String())
	}
}
