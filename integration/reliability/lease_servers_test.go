package reliability

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/internal/testkit/zktest"
)

// The servers the lease history check starts for itself: an embedded etcd
// member and a standalone ZooKeeper: the few lines the check needs. (The
// shared harnesses lease/etcdlease/etcdtest and internal/testkit/zktest could serve here
// too; they start clusters with more options than this check uses.)

// startEtcd starts a one-member etcd inside the test process on free
// loopback ports, with heartbeats every 50 ms and elections after 500 ms
// (a starved process on a loaded machine misses shorter ones; its minimum
// lease TTL is still 1 s), no fsync, and returns its client URL. It is
// stopped when the test ends.
func startEtcd(t *testing.T) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "rel"
	cfg.Dir = filepath.Join(t.TempDir(), "etcd")
	peer, client := freeLoopbackURL(t), freeLoopbackURL(t)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.InitialClusterToken = fmt.Sprintf("fencekit-rel-%d", time.Now().UnixNano())
	cfg.TickMs, cfg.ElectionMs = 50, 500
	cfg.UnsafeNoFsync = true
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("embedded etcd: not ready within 30s")
	}
	return client.String()
}

// freeLoopbackURL returns an http URL on a loopback port nothing listens on
// now.
func freeLoopbackURL(t *testing.T) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

// zkJar is Debian's ZooKeeper (package zookeeper; scripts/services.sh
// ensure_zookeeper installs it), or FENCE_ZK_JAR.
func zkJar() string {
	if j := os.Getenv("FENCE_ZK_JAR"); j != "" {
		return j
	}
	return "/usr/share/java/zookeeper.jar"
}

// startZooKeeper starts a standalone ZooKeeper server (java, Debian's jar)
// on a free loopback port with a 100 ms tick, granting session timeouts from
// 200 ms to 60 s, and returns its address once it serves. It is killed and
// its data removed when the test ends. A missing jar or java fails the test.
func startZooKeeper(t *testing.T) string {
	t.Helper()
	jar := zkJar()
	if _, err := os.Stat(jar); err != nil {
		t.Fatalf("ZooKeeper jar %s: %v (run `. scripts/services.sh; ensure_zookeeper`, or set FENCE_ZK_JAR)", jar, err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java: %v (Debian's zookeeper package brings it)", err)
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	l.Close()
	conf := filepath.Join(dir, "zoo.cfg")
	body := fmt.Sprintf("tickTime=100\ndataDir=%s\nclientPort=%s\nclientPortAddress=127.0.0.1\n"+
		"minSessionTimeout=200\nmaxSessionTimeout=60000\nadmin.enableServer=false\n"+
		"4lw.commands.whitelist=ruok,srvr,mntr,stat\nforceSync=no\nmaxClientCnxns=0\n"+
		"znode.container.checkIntervalMs=1000\n", filepath.Join(dir, "data"), port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "zookeeper.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(java, "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true",
		"-cp", jar, "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start ZooKeeper: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
	})
	deadline := time.Now().Add(40 * time.Second)
	for {
		if mode, err := zktest.ServerMode(addr); err == nil && mode == "standalone" {
			return addr
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("ZooKeeper exited at start: %s", lastLines(string(log), 5))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ZooKeeper at %s did not serve within 40s", addr)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
