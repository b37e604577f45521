package reliability

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// The servers the lease history check starts for itself: a one-member
// etcd cluster (lease/etcdlease/etcdtest) and a standalone ZooKeeper.
// (The shared harness internal/testkit/zktest could serve here too; it
// starts ensembles with more options than this check uses.)

// startEtcd starts a one-member etcd (a process of its own) on free
// loopback ports, with heartbeats every 50 ms and elections after 500 ms
// (etcdtest.Steady: a starved process on a loaded machine misses shorter
// ones; its minimum lease TTL is still 1 s), no fsync, and returns its
// client URL. It is stopped when the test ends.
func startEtcd(t *testing.T) string {
	t.Helper()
	return etcdtest.StartWith(t, 1, etcdtest.Steady).Endpoints()[0]
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
