// Package zktest starts real ZooKeeper servers for tests: a standalone
// server or an ensemble of several members, each a java process on free
// loopback ports with a throwaway data directory, stopped and removed when
// the test ends. It runs Debian's ZooKeeper directly
// (/usr/share/java/zookeeper.jar; scripts/services.sh ensure_zookeeper
// installs it) and fails the test loudly when java or the jar is missing.
package zktest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/ports"
)

// JarVar names the environment variable that overrides the ZooKeeper jar.
const JarVar = "FENCE_ZK_JAR"

// DefaultJar is Debian's ZooKeeper jar (package zookeeper); its manifest
// names the jars it needs.
const DefaultJar = "/usr/share/java/zookeeper.jar"

// logJar, when present, makes the servers log (to server.log in each
// member's directory).
const logJar = "/usr/share/java/slf4j-simple.jar"

// TickTime is the servers' tick. Session timeouts are bounded to
// [2, 20] × TickTime unless Config says otherwise.
const TickTime = 200 * time.Millisecond

// Config tunes an ensemble. The zero value is usable.
type Config struct {
	// MinSessionTimeout and MaxSessionTimeout bound the session timeouts
	// the servers grant. Defaults 2 × TickTime and 60 s.
	MinSessionTimeout, MaxSessionTimeout time.Duration
}

// Member is one server of an ensemble.
type Member struct {
	ID         int
	Dir        string
	ClientPort int
	peerPort   int
	electPort  int
	t          testing.TB
	conf       string

	shared bool // a member of a Shared ensemble: never stopped by a test

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Addr returns the member's client address, 127.0.0.1:port.
func (m *Member) Addr() string { return fmt.Sprintf("127.0.0.1:%d", m.ClientPort) }

// Ensemble is a running set of members (one: standalone).
type Ensemble struct {
	t       testing.TB
	Members []*Member
	shared  bool
}

// Servers returns every member's client address.
func (e *Ensemble) Servers() []string {
	out := make([]string, len(e.Members))
	for i, m := range e.Members {
		out[i] = m.Addr()
	}
	return out
}

// Start starts an ensemble of n members (1: a standalone server) and waits
// until every member serves. Everything is stopped and removed when the
// test ends. Ports are picked free just before the servers bind them; if
// another process takes one in between, the ensemble is started again on
// other ports (three tries).
func Start(t testing.TB, n int, cfg Config) *Ensemble {
	t.Helper()
	e, err := startTries(t, n, cfg, t.TempDir())
	if err != nil {
		t.Fatalf("zktest: %v", err)
	}
	t.Cleanup(e.kill)
	return e
}

// startTries starts an ensemble in dir, three times at most.
func startTries(t testing.TB, n int, cfg Config, dir string) (*Ensemble, error) {
	t.Helper()
	var last error
	for try := range 3 {
		e, err := start(t, n, cfg, filepath.Join(dir, fmt.Sprintf("try%d", try)))
		if err == nil {
			return e, nil
		}
		last = err
		e.kill()
	}
	return nil, last
}

// kill stops every member with SIGKILL.
func (e *Ensemble) kill() {
	for _, m := range e.Members {
		m.stop(syscall.SIGKILL)
	}
}

// shared holds the ensembles Shared started, by size.
var shared struct {
	mu   sync.Mutex
	ens  map[int]*Ensemble
	dirs []string
}

// Shared returns a standalone server (n = 1) or an ensemble of n members
// with the default Config, started by the first test of the test binary
// that asks for it and served to every later one, until StopShared. It is
// for tests that stop, pause, restart or reconfigure no member and keep to
// a root znode of their own (Root): each ensemble costs its members' JVM
// start-up and a leader election, several seconds of two cores, which a
// test that only needs a server to talk to need not pay. A member of a
// shared ensemble refuses Kill, Pause, Resume and Start (it panics), and
// the Ensemble refuses Restart. A shared ensemble of several members
// stays busy with what earlier tests left (sessions expiring, container
// nodes swept), so a member's reads lag the others' writes longer than on
// an idle one: a test that reads through one member what it wrote through
// another (zklease's conformance suite, hand-overs between clients) starts
// its own. A test binary that calls Shared stops the
// servers from TestMain: goleak.VerifyTestMain(zktest.StopSharedAfter(m)).
func Shared(t testing.TB, n int) *Ensemble {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	base := shared.ens[n]
	if base == nil {
		dir, err := os.MkdirTemp("", "zktest-shared-")
		if err != nil {
			t.Fatalf("zktest: %v", err)
		}
		shared.dirs = append(shared.dirs, dir)
		base, err = startTries(t, n, Config{}, dir)
		if err != nil {
			t.Fatalf("zktest: shared ensemble of %d: %v", n, err)
		}
		for _, m := range base.Members {
			m.shared = true
		}
		if shared.ens == nil {
			shared.ens = map[int]*Ensemble{}
		}
		shared.ens[n] = base
	}
	return &Ensemble{t: t, Members: base.Members, shared: true}
}

// StopShared stops the servers Shared started and removes their data.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	for _, e := range shared.ens {
		e.kill()
	}
	for _, d := range shared.dirs {
		_ = os.RemoveAll(d)
	}
	shared.ens, shared.dirs = nil, nil
}

// StopSharedAfter wraps a TestMain's m so that its Run stops the shared
// servers when the tests are done, before a leak check that runs after
// it (goleak.VerifyTestMain takes the wrapper).
func StopSharedAfter(m interface{ Run() int }) interface{ Run() int } {
	return stopAfter{m}
}

type stopAfter struct{ m interface{ Run() int } }

func (s stopAfter) Run() int {
	defer StopShared()
	return s.m.Run()
}

func start(t testing.TB, n int, cfg Config, root string) (*Ensemble, error) {
	t.Helper()
	jar := os.Getenv(JarVar)
	if jar == "" {
		jar = DefaultJar
	}
	if _, err := os.Stat(jar); err != nil {
		t.Fatalf("zktest: ZooKeeper jar %s not found (%v): run `. scripts/services.sh; ensure_zookeeper` (Debian package zookeeper) or set %s", jar, err, JarVar)
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Fatalf("zktest: java not found (%v): Debian's zookeeper package brings it; run `. scripts/services.sh; ensure_zookeeper`", err)
	}
	if cfg.MinSessionTimeout == 0 {
		cfg.MinSessionTimeout = 2 * TickTime
	}
	if cfg.MaxSessionTimeout == 0 {
		cfg.MaxSessionTimeout = 60 * time.Second
	}
	e := &Ensemble{t: t}
	for i := range n {
		// Ports reserved for this process (package ports).
		m := &Member{ID: i + 1, Dir: filepath.Join(root, fmt.Sprintf("zk%d", i+1)), ClientPort: ports.Loopback(t), peerPort: ports.Loopback(t), electPort: ports.Loopback(t), t: t}
		e.Members = append(e.Members, m)
	}
	for _, m := range e.Members {
		if err := os.MkdirAll(filepath.Join(m.Dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "tickTime=%d\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n",
			TickTime.Milliseconds(), filepath.Join(m.Dir, "data"), m.ClientPort)
		fmt.Fprintf(&b, "minSessionTimeout=%d\nmaxSessionTimeout=%d\n", cfg.MinSessionTimeout.Milliseconds(), cfg.MaxSessionTimeout.Milliseconds())
		b.WriteString("admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr,stat\nforceSync=no\nmaxClientCnxns=0\n")
		// Container nodes left empty are deleted after this check interval.
		b.WriteString("znode.container.checkIntervalMs=1000\n")
		if n > 1 {
			for _, o := range e.Members {
				fmt.Fprintf(&b, "server.%d=127.0.0.1:%d:%d\n", o.ID, o.peerPort, o.electPort)
			}
			if err := os.WriteFile(filepath.Join(m.Dir, "data", "myid"), []byte(fmt.Sprintf("%d\n", m.ID)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		m.conf = filepath.Join(m.Dir, "zoo.cfg")
		if err := os.WriteFile(m.conf, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range e.Members {
		m.start()
	}
	return e, e.waitReady(40 * time.Second)
}

// Start starts the member's server process (again, after Kill or Stop),
// over the same data directory. It does not wait for it to serve.
func (m *Member) Start() {
	m.t.Helper()
	m.refuseShared("Start")
	m.start()
}

// refuseShared panics if m belongs to a Shared ensemble: a test that
// stops or pauses a member needs an ensemble of its own (Start).
func (m *Member) refuseShared(what string) {
	if m.shared {
		panic(fmt.Sprintf("zktest: %s on member %d of a shared ensemble: a test that stops, pauses or restarts members starts its own (zktest.Start)", what, m.ID))
	}
}

func (m *Member) start() {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.t.Fatalf("zktest: member %d is already running", m.ID)
	}
	jar := os.Getenv(JarVar)
	if jar == "" {
		jar = DefaultJar
	}
	cp := jar
	if _, err := os.Stat(logJar); err == nil {
		cp += ":" + logJar
	}
	cmd := exec.Command("java", "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=info", "-Dzookeeper.jmx.log4j.disable=true",
		"-cp", cp, "org.apache.zookeeper.server.quorum.QuorumPeerMain", m.conf)
	logf, err := os.OpenFile(filepath.Join(m.Dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		m.t.Fatalf("zktest: start member %d: %v", m.ID, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	m.cmd, m.done = cmd, done
}

// Kill stops the member with SIGKILL (a crash) and waits for it to exit.
func (m *Member) Kill() {
	m.refuseShared("Kill")
	m.stop(syscall.SIGKILL)
}

// Pause freezes the member with SIGSTOP; Resume thaws it.
func (m *Member) Pause() {
	m.refuseShared("Pause")
	m.signal(syscall.SIGSTOP)
}

// Resume sends SIGCONT.
func (m *Member) Resume() {
	m.refuseShared("Resume")
	m.signal(syscall.SIGCONT)
}

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		_ = m.cmd.Process.Signal(sig)
	}
}

func (m *Member) stop(sig syscall.Signal) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd, m.done = nil, nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process must run to die of SIGTERM
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Running reports whether the member's process is up.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}

// Mode asks the member (srvr) for its mode: "leader", "follower" or
// "standalone"; an error when it does not serve.
func (m *Member) Mode() (string, error) {
	mode, err := ServerMode(m.Addr())
	if err != nil {
		return "", fmt.Errorf("zktest: member %d: %w", m.ID, err)
	}
	return mode, nil
}

// ServerMode asks the ZooKeeper server at addr (the srvr command) for its
// mode: "leader", "follower" or "standalone"; an error when it does not
// answer with one.
func ServerMode(addr string) (string, error) {
	out, err := FourLetter(addr, "srvr", 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("no answer to ZooKeeper's srvr command at %s (is it ZooKeeper?): %w", addr, err)
	}
	for _, line := range strings.Split(out, "\n") {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(mode), nil
		}
	}
	return "", fmt.Errorf("%s does not serve: no mode in its answer to srvr (not ZooKeeper, not serving yet, or srvr is not in its 4lw.commands.whitelist): %q", addr, strings.TrimSpace(out))
}

// WaitReady waits until every running member reports a mode and, in an
// ensemble, one of them leads.
func (e *Ensemble) WaitReady(timeout time.Duration) {
	e.t.Helper()
	if err := e.waitReady(timeout); err != nil {
		e.t.Fatalf("zktest: %v", err)
	}
}

func (e *Ensemble) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		leaders, serving, running := 0, 0, 0
		var last error
		for _, m := range e.Members {
			if !m.Running() {
				continue
			}
			running++
			mode, err := m.Mode()
			if err != nil {
				last = err
				continue
			}
			serving++
			if mode == "leader" || mode == "standalone" {
				leaders++
			}
		}
		if running > 0 && serving == running && leaders == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ensemble did not serve within %v (%d of %d running members serve, %d leaders; last error %v); logs in %s",
				timeout, serving, running, leaders, last, filepath.Dir(e.Members[0].Dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leader returns the member that leads (waiting for one for up to
// timeout).
func (e *Ensemble) Leader(timeout time.Duration) *Member {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, m := range e.Members {
			if !m.Running() {
				continue
			}
			if mode, err := m.Mode(); err == nil && (mode == "leader" || mode == "standalone") {
				return m
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("zktest: no leader within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart stops every member (SIGTERM), then starts them all again over the
// same data, and waits until they serve.
func (e *Ensemble) Restart() {
	e.t.Helper()
	if e.shared {
		e.t.Fatalf("zktest: Restart of a shared ensemble: a test that restarts servers starts its own (zktest.Start)")
	}
	for _, m := range e.Members {
		m.stop(syscall.SIGTERM)
	}
	for _, m := range e.Members {
		m.Start()
	}
	e.WaitReady(60 * time.Second)
}

// FourLetter sends a four-letter command to addr and returns the answer.
func FourLetter(addr, cmd string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	if err != nil && len(b) == 0 {
		return "", err
	}
	return string(b), nil
}

// ExpireSession ends a session at the store, as an expiry would: it
// connects to addr with the session's ID and password (taking the session
// over) and closes it. The ensemble deletes the session's ephemeral nodes
// and closes the client's own connection; the client learns of the expiry
// when it reconnects.
func ExpireSession(ctx context.Context, addr string, id int64, passwd []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	// ConnectRequest: protocolVersion int32, lastZxidSeen int64, timeOut
	// int32, sessionId int64, passwd buffer; then readOnly bool.
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, 30000)
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	req = append(req, 0)
	if err := writeFrame(c, req); err != nil {
		return err
	}
	resp, err := readFrame(c)
	if err != nil {
		return fmt.Errorf("zktest: connect response: %w", err)
	}
	if len(resp) < 16 || int64(binary.BigEndian.Uint64(resp[8:16])) != id {
		return errors.New("zktest: the server did not give the session back (already expired?)")
	}
	// Close: header xid int32, type int32 (-11).
	closeReq := binary.BigEndian.AppendUint32(nil, 1)
	closeReq = binary.BigEndian.AppendUint32(closeReq, uint32(0xfffffff5))
	if err := writeFrame(c, closeReq); err != nil {
		return err
	}
	if _, err := readFrame(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("zktest: close response: %w", err)
	}
	return nil
}

func writeFrame(w io.Writer, p []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...))
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > 1<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

var rootSeq atomic.Int64

// Root returns a root znode unique to the test (for zklease.WithRoot):
// "/fencekit-test/<test name>-<n>", the name's separators made "_".
func Root(t testing.TB) string {
	n := strings.NewReplacer("/", "_", " ", "_", "=", "_", ":", "_", ".", "_").Replace(t.Name())
	return fmt.Sprintf("/fencekit-test/%s-%d", n, rootSeq.Add(1))
}
