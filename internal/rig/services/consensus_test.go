package services

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/zktest"
)

// TestProvideStartsEtcdAndZooKeeper: with nothing at the default addresses
// (this machine runs neither), Provide starts a one-member etcd (built once
// into the user cache) and a standalone ZooKeeper, both serving, and Close
// stops them and removes their data directories.
func TestProvideStartsEtcdAndZooKeeper(t *testing.T) {
	ctx := context.Background()
	for _, v := range []string{EtcdEndpointsVar, ZooKeeperServersVar} {
		t.Setenv(v, "")
	}
	if etcdHealthy(ctx, []string{DefaultEtcdEndpoint}) == nil || zkServing([]string{DefaultZooKeeperServer}) == nil {
		t.Fatalf("an etcd at %s or a ZooKeeper at %s answers: this test checks that Provide starts its own; stop them to run it", DefaultEtcdEndpoint, DefaultZooKeeperServer)
	}
	s, err := Provide(ctx, Config{Etcd: true, ZooKeeper: true, NoRedis: true, NoS3: true, Log: t.Logf})
	if err != nil {
		t.Fatalf("Provide: %v", err)
	}
	defer s.Close()
	if !s.EtcdStarted || len(s.EtcdEndpoints) != 1 || !s.ZooKeeperStarted || len(s.ZooKeeperServers) != 1 || s.ZooKeeperTick != zkTick {
		t.Fatalf("Set = %+v; want one etcd and one ZooKeeper it started", s)
	}
	if err := etcdHealthy(ctx, s.EtcdEndpoints); err != nil {
		t.Fatalf("etcd at %v: %v", s.EtcdEndpoints, err)
	}
	if mode, err := zktest.ServerMode(s.ZooKeeperServers[0]); err != nil || mode != "standalone" {
		t.Fatalf("ZooKeeper at %v: mode %q, %v", s.ZooKeeperServers, mode, err)
	}
	var used string
	for _, u := range s.Used {
		used += u + "\n"
	}
	if !strings.Contains(used, "etcd "+EtcdVersion+" started by this program") || !strings.Contains(used, "standalone server started by this program") {
		t.Errorf("Used = %q; want both named as started", s.Used)
	}
	dirs := s.Dirs
	s.Close()
	if etcdHealthy(ctx, s.EtcdEndpoints) == nil {
		t.Error("etcd still answers after Close")
	}
	if zkServing(s.ZooKeeperServers) == nil {
		t.Error("ZooKeeper still answers after Close")
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("data directory %s is still there after Close (%v)", d, err)
		}
	}
}

// TestProvideNamesUnreachableConsensusStores: addresses given explicitly
// are used or reported, never replaced by a server Provide starts.
func TestProvideNamesUnreachableConsensusStores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Provide(ctx, Config{Etcd: true, ZooKeeper: true, NoRedis: true, NoS3: true,
		EtcdEndpoints: "http://127.0.0.1:1", ZooKeeperServers: "127.0.0.1:1"})
	if err == nil {
		t.Fatal("Provide with unreachable etcd and ZooKeeper succeeded")
	}
	for _, want := range []string{"etcd: http://127.0.0.1:1:", "unset " + EtcdEndpointsVar, "zookeeper: 127.0.0.1:1:", "unset " + ZooKeeperServersVar} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// From the environment, the same.
	t.Setenv(ZooKeeperServersVar, "127.0.0.1:1, ")
	if _, err := Provide(ctx, Config{ZooKeeper: true, NoRedis: true, NoS3: true}); err == nil || !strings.Contains(err.Error(), "zookeeper: 127.0.0.1:1, :") {
		t.Errorf("Provide with %s unreachable: %v", ZooKeeperServersVar, err)
	}
}
