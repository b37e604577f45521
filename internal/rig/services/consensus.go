package services

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/ports"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
)

// The environment variables that name the consensus stores a program's
// leases may live in (--lease-store etcd or zookeeper).
const (
	// EtcdEndpointsVar lists etcd client URLs, comma-separated
	// (http://127.0.0.1:2379,...).
	EtcdEndpointsVar = "FENCE_ETCD_ENDPOINTS"
	// ZooKeeperServersVar lists ZooKeeper servers, comma-separated
	// (127.0.0.1:2181,...).
	ZooKeeperServersVar = "FENCE_ZK_SERVERS"
	// ZooKeeperJarVar overrides the ZooKeeper jar the programs start
	// (default DefaultZooKeeperJar).
	ZooKeeperJarVar = "FENCE_ZK_JAR"
)

// The default local addresses, tried before a server is started.
const (
	DefaultEtcdEndpoint    = "http://127.0.0.1:2379"
	DefaultZooKeeperServer = "127.0.0.1:2181"
	// DefaultZooKeeperJar is Debian's ZooKeeper (package zookeeper, which
	// brings Java); scripts/services.sh ensure_zookeeper installs it.
	DefaultZooKeeperJar = "/usr/share/java/zookeeper.jar"
)

// EtcdVersion is the etcd server release the programs build and start when
// no etcd answers (go.etcd.io/etcd/server/v3, as examples/go.mod requires).
const EtcdVersion = "v3.7.3"

// etcdServerPkg is the main package Provide builds etcd's server from.
const etcdServerPkg = "github.com/fencekit/fencekit/internal/rig/cmd/etcdserver"

// The raft timing of the etcd server Provide starts: with
// an election timeout of 500 ms the server's shortest lease TTL is 1 s (etcd
// raises a TTL to 1.5 × the election timeout, rounded up to whole seconds);
// with etcd's defaults (100 and 1000) it is 2 s.
const etcdElectionMs = 500 // heartbeats every 50 ms

// The ZooKeeper server Provide starts: its tick, and the session timeouts it
// grants (a lease's TTL is its session timeout: see Set.ZooKeeperTick).
const (
	zkTick              = 100 * time.Millisecond
	zkMinSessionTimeout = 2 * zkTick
	zkMaxSessionTimeout = 2 * time.Minute
)

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// etcd finds or starts an etcd server: the endpoints given (Config, then
// EtcdEndpointsVar), else the default local address, else one it builds
// (once, into the user cache) and starts on loopback.
func (s *Set) etcd(ctx context.Context, cfg Config) error {
	list, explicit := firstNonEmpty(cfg.EtcdEndpoints, os.Getenv(EtcdEndpointsVar), DefaultEtcdEndpoint)
	eps := splitList(list)
	err := etcdHealthy(ctx, eps)
	if err == nil {
		s.EtcdEndpoints = eps
		s.use("etcd:       %s (%s)", strings.Join(eps, ","), origin(explicit, cfg.EtcdEndpoints != ""))
		return nil
	}
	if explicit {
		return fmt.Errorf("etcd: %s: %w (start it, or unset %s to let the program find or start one)", strings.Join(eps, ","), err, EtcdEndpointsVar)
	}
	ep, stop, serr := startEtcd(ctx, cfg.Log, s.dirs, etcdElectionMs)
	if serr != nil {
		return fmt.Errorf("etcd: nothing answered at %s (%v) and no etcd could be started: %w (or set %s)", list, err, serr, EtcdEndpointsVar)
	}
	s.onClose(stop)
	s.EtcdEndpoints, s.EtcdStarted = []string{ep}, true
	s.use("etcd:       %s (etcd %s started by this program; nothing answered at %s)", ep, EtcdVersion, list)
	return nil
}

// etcdHealthy asks every endpoint's /health; nil when one of them answers
// healthy (a client needs only one to reach the cluster).
func etcdHealthy(ctx context.Context, eps []string) error {
	if len(eps) == 0 {
		return errors.New("no endpoint")
	}
	client := http.Client{Timeout: 2 * time.Second}
	var errs []error
	for _, ep := range eps {
		if !strings.Contains(ep, "://") {
			ep = "http://" + ep
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(ep, "/")+"/health", nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`) {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s/health answered %s: %.200s", ep, resp.Status, body))
	}
	return errors.Join(errs...)
}

// etcdBinary returns the etcd server of package internal/rig/cmd/etcdserver,
// built at EtcdVersion into the user cache: the cached one, else it builds
// it there with go build (once).
func etcdBinary(ctx context.Context, logf func(string, ...any)) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bindir := filepath.Join(cache, "fencekit", "bin")
	cached := filepath.Join(bindir, "etcd-"+EtcdVersion)
	if hasModule(cached, "go.etcd.io/etcd/server/v3", EtcdVersion) {
		return cached, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("the go command is not on PATH to build etcd")
	}
	// The main package sits in this module's source tree; the go command
	// finds it from the caller's module or workspace (a path from
	// runtime.Caller would not survive -trimpath, which the test script
	// sets so that clones share the build cache).
	out, err := exec.CommandContext(ctx, goBin, "list", "-f", "{{.Dir}}", etcdServerPkg).Output()
	src := strings.TrimSpace(string(out))
	if err != nil || src == "" {
		return "", fmt.Errorf("go list %s: the etcd server's source is not in this module or workspace: %v", etcdServerPkg, err)
	}
	logf("building etcd %s into %s: once, later runs reuse it.", EtcdVersion, bindir)
	logf("with an empty Go build cache this compiles etcd's server: measured 46 s on 2 cores with its modules already downloaded, a minute or two more to download them ...")
	if err := os.MkdirAll(bindir, 0o755); err != nil {
		return "", err
	}
	tmp := cached + ".building-" + randomHex(4)
	cmd := exec.CommandContext(ctx, goBin, "build", "-v", "-o", tmp, ".")
	cmd.Dir = src
	if err := runBuild(ctx, cmd, "etcd", logf); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("go build etcd %s: %w", EtcdVersion, err)
	}
	if err := os.Rename(tmp, cached); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return cached, nil
}

// StartEtcd starts a one-member etcd (built as Provide builds it) with an
// election timeout of electionMs milliseconds (heartbeats a tenth of it)
// on loopback, for tests of servers with other timings than Provide's:
// its shortest lease TTL is 1.5 × the election timeout, rounded up to
// whole seconds. stop stops it and removes its data.
func StartEtcd(ctx context.Context, electionMs int, logf func(string, ...any)) (endpoint string, stop func(), err error) {
	return startEtcd(ctx, logf, &dataDirs{}, electionMs)
}

// startEtcd starts a one-member etcd cluster on free loopback ports over a
// throwaway data directory and waits until it is healthy.
func startEtcd(ctx context.Context, logf func(string, ...any), dirs *dataDirs, electionMs int) (string, func(), error) {
	bin, err := etcdBinary(ctx, logf)
	if err != nil {
		return "", nil, err
	}
	clientPort, err := ports.Free()
	if err != nil {
		return "", nil, err
	}
	peerPort, err := ports.Free()
	if err != nil {
		return "", nil, err
	}
	dir, removeDir, err := dirs.make("etcd")
	if err != nil {
		return "", nil, err
	}
	clientURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))
	logFile, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		removeDir()
		return "", nil, err
	}
	cmd := exec.Command(bin, "--name", "demo", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "demo="+peerURL, "--initial-cluster-state", "new",
		"--heartbeat-interval", strconv.Itoa(max(electionMs/10, 1)), "--election-timeout", strconv.Itoa(electionMs),
		"--unsafe-no-fsync", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	stop, err := startProcess(ctx, cmd, syscall.SIGKILL, 30*time.Second, func() bool { return etcdHealthy(ctx, []string{clientURL}) == nil })
	if err != nil {
		logFile.Close()
		log, _ := os.ReadFile(logFile.Name())
		removeDir()
		return "", nil, fmt.Errorf("%w: %s", err, lastLine(string(log)))
	}
	return clientURL, func() { stop(); logFile.Close(); removeDir() }, nil
}

// zookeeper finds or starts a ZooKeeper server: the servers given (Config,
// then ZooKeeperServersVar), else the default local address, else a
// standalone server it starts from Debian's jar on loopback.
func (s *Set) zookeeper(ctx context.Context, cfg Config) error {
	list, explicit := firstNonEmpty(cfg.ZooKeeperServers, os.Getenv(ZooKeeperServersVar), DefaultZooKeeperServer)
	servers := splitList(list)
	err := zkServing(servers)
	if err == nil {
		s.ZooKeeperServers = servers
		s.use("ZooKeeper:  %s (%s)", strings.Join(servers, ","), origin(explicit, cfg.ZooKeeperServers != ""))
		return nil
	}
	if explicit {
		return fmt.Errorf("zookeeper: %s: %w (start it, or unset %s to let the program find or start one)", list, err, ZooKeeperServersVar)
	}
	addr, stop, serr := startZooKeeper(ctx, s.dirs)
	if serr != nil {
		return fmt.Errorf("zookeeper: nothing answered at %s (%v) and no server could be started: %w (or set %s)", list, err, serr, ZooKeeperServersVar)
	}
	s.onClose(stop)
	s.ZooKeeperServers, s.ZooKeeperStarted, s.ZooKeeperTick = []string{addr}, true, zkTick
	s.use("ZooKeeper:  %s (a standalone server started by this program; nothing answered at %s)", addr, list)
	return nil
}

// zkServing asks every server for its mode (the srvr command); nil when one
// of them serves (a client needs only one to reach the ensemble).
func zkServing(servers []string) error {
	if len(servers) == 0 {
		return errors.New("no server")
	}
	var errs []error
	for _, addr := range servers {
		mode, err := zktest.ServerMode(addr)
		switch {
		case err != nil:
			errs = append(errs, err)
		case mode == "leader" || mode == "follower" || mode == "observer" || mode == "standalone":
			return nil
		default:
			errs = append(errs, fmt.Errorf("%s is in mode %q, not serving", addr, mode))
		}
	}
	return errors.Join(errs...)
}

// startZooKeeper starts a standalone ZooKeeper server (Debian's jar, with
// java) on a free loopback port over a throwaway data directory.
func startZooKeeper(ctx context.Context, dirs *dataDirs) (string, func(), error) {
	jar := os.Getenv(ZooKeeperJarVar)
	if jar == "" {
		jar = DefaultZooKeeperJar
	}
	if _, err := os.Stat(jar); err != nil {
		return "", nil, fmt.Errorf("the ZooKeeper jar %s is missing: install Debian's zookeeper package (apt-get install zookeeper; scripts/services.sh ensure_zookeeper does it) or set %s", jar, ZooKeeperJarVar)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return "", nil, errors.New("java is not on PATH (Debian's zookeeper package brings it)")
	}
	port, err := ports.Free()
	if err != nil {
		return "", nil, err
	}
	dir, removeDir, err := dirs.make("zookeeper")
	if err != nil {
		return "", nil, err
	}
	conf := filepath.Join(dir, "zoo.cfg")
	var b strings.Builder
	fmt.Fprintf(&b, "tickTime=%d\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n", zkTick.Milliseconds(), filepath.Join(dir, "data"), port)
	fmt.Fprintf(&b, "minSessionTimeout=%d\nmaxSessionTimeout=%d\n", zkMinSessionTimeout.Milliseconds(), zkMaxSessionTimeout.Milliseconds())
	b.WriteString("admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr,stat\nforceSync=no\nmaxClientCnxns=0\n")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		removeDir()
		return "", nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "zookeeper.log"))
	if err != nil {
		removeDir()
		return "", nil, err
	}
	cmd := exec.Command(java, "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true",
		"-cp", jar, "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	stop, err := startProcess(ctx, cmd, syscall.SIGKILL, 30*time.Second, func() bool { return zkServing([]string{addr}) == nil })
	if err != nil {
		logFile.Close()
		log, _ := os.ReadFile(logFile.Name())
		removeDir()
		return "", nil, fmt.Errorf("%w: %s", err, lastLine(string(log)))
	}
	return addr, func() { stop(); logFile.Close(); removeDir() }, nil
}

// ZooKeeperSessionBounds names the session timeouts the ZooKeeper server
// Provide starts grants.
var ZooKeeperSessionBounds = fmt.Sprintf("the server this program started grants %v to %v", zkMinSessionTimeout, zkMaxSessionTimeout)

// EtcdMinTTL is the shortest lease TTL the etcd server Provide starts
// grants (its election timeout is 500 ms).
const EtcdMinTTL = time.Second
