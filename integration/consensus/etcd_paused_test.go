package consensus

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/integration/consensus/internal/guarded"
	"github.com/fencekit/fencekit/lease"
)

// etcdHolderEvent is one line of etcdholder's output.
type etcdHolderEvent struct {
	At       time.Time       `json:"at"`
	Kind     string          `json:"kind"`
	Token    fence.Token     `json:"token"`
	Sent     time.Time       `json:"sent"`
	Deadline time.Time       `json:"deadline"`
	Valid    bool            `json:"valid"`
	Write    guarded.Outcome `json:"write"`
	Text     string          `json:"text"`
}

// etcdHolderProc is a running etcdholder.
type etcdHolderProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan etcdHolderEvent
	done   chan struct{}
	stderr strings.Builder
	mu     sync.Mutex
}

func startEtcdHolder(t *testing.T, args ...string) *etcdHolderProc {
	t.Helper()
	h := &etcdHolderProc{t: t, events: make(chan etcdHolderEvent, 256), done: make(chan struct{})}
	h.cmd = exec.Command(helperPath(t, "etcdholder"), args...)
	h.cmd.Stderr = writerFunc(func(p []byte) (int, error) { h.mu.Lock(); defer h.mu.Unlock(); return h.stderr.Write(p) })
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("start etcdholder: %v", err)
	}
	go func() {
		defer close(h.done)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			var e etcdHolderEvent
			if json.Unmarshal(s.Bytes(), &e) == nil {
				h.events <- e
			}
		}
		_ = h.cmd.Wait()
		close(h.events)
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGCONT)
		_ = h.cmd.Process.Kill()
		<-h.done
	})
	return h
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (h *etcdHolderProc) send(cmd string) {
	h.t.Helper()
	if _, err := io.WriteString(h.stdin, cmd+"\n"); err != nil {
		h.t.Fatalf("etcdholder: send %q: %v", cmd, err)
	}
}

// next returns the next event of the given kind, skipping others.
func (h *etcdHolderProc) next(kind string, timeout time.Duration) etcdHolderEvent {
	h.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-h.events:
			if !ok {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.t.Fatalf("etcdholder exited before reporting %q: %s", kind, h.stderr.String())
			}
			if e.Kind == "failed" {
				h.t.Fatalf("etcdholder failed: %s", e.Text)
			}
			if e.Kind == kind {
				return e
			}
		case <-timer.C:
			h.t.Fatalf("etcdholder did not report %q within %v", kind, timeout)
		}
	}
}

// A holder process frozen with SIGSTOP between checking its lease and
// writing: when the pause outlasts its grant, another client takes the
// lease and writes, and the frozen holder's writes, once it is resumed,
// are rejected as stale at PostgreSQL and S3; when the pause is well within
// its grant, it keeps the lease and its writes land.
func TestPausedHolderRejectedAtStores(t *testing.T) {
	const ttl = 2 * time.Second
	for _, c := range []struct {
		pause time.Duration
		stale bool
	}{
		{pause: ttl * 3 / 10, stale: false},
		{pause: ttl + 500*time.Millisecond, stale: true},
		{pause: 2*ttl + time.Second, stale: true},
	} {
		t.Run(fmt.Sprintf("pause=%v", c.pause), func(t *testing.T) {
			testPausedHolder(t, ttl, c.pause, c.stale)
		})
	}
}

func testPausedHolder(t *testing.T, ttl, pause time.Duration, stale bool) {
	ctx := ctxT(t)
	res, drop, err := guarded.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop(context.Background()) })
	cl := etcdCluster(t)
	p := etcdPrefix(t)
	resJSON, _ := json.Marshal(res)
	a := startEtcdHolder(t, "-endpoints", strings.Join(cl.Endpoints(), ","), "-prefix", p, "-name", "job",
		"-ttl", ttl.String(), "-min-ttl", "1s", "-resource", string(resJSON))
	acq := a.next("acquired", 30*time.Second)
	a.next("renewed", 10*ttl)
	a.send("check")
	if chk := a.next("checked", 10*time.Second); !chk.Valid {
		t.Fatalf("the holder's lease was not valid at its check: %s", chk.Text)
	}
	// Frozen right after its check, before its write.
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	stopped := time.Now()
	bM := newManager(t, newEtcdBackend(t, cl.Client(), p), ttl)
	var lb *lease.Lease
	if stale {
		lb, err = bM.Acquire(ctx, "job")
		if err != nil {
			t.Fatalf("B's Acquire while A is frozen: %v", err)
		}
		t.Logf("A (token %d) frozen; B acquired %v later with token %d", acq.Token, time.Since(stopped).Round(time.Millisecond), lb.Token())
		if lb.Token() <= acq.Token {
			t.Fatalf("B's token %d <= A's %d", lb.Token(), acq.Token)
		}
		for _, w := range guarded.Write(ctx, res, "B", lb.Token()) {
			if !w.Accepted {
				t.Fatalf("B's write to %s: %s", w.Store, w.Err)
			}
		}
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	if !stale {
		if _, err := bM.TryAcquire(ctx, "job"); err == nil {
			t.Fatal("B acquired the lease while A, frozen for less than its TTL, held it")
		}
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v", err)
	}
	a.send("write")
	for range 2 {
		w := a.next("write", 30*time.Second).Write
		switch {
		case stale && (w.Accepted || !w.Stale):
			t.Errorf("A's write to %s after a pause of %v (TTL %v): accepted=%v stale=%v (%s); want rejected as stale", w.Store, pause, ttl, w.Accepted, w.Stale, w.Err)
		case !stale && !w.Accepted:
			t.Errorf("A's write to %s after a pause of %v, within its TTL %v: %s; want accepted", w.Store, pause, ttl, w.Err)
		}
	}
	rowBy, rowTok, objBy, objTok, err := guarded.Stored(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	want, wantTok := "A", acq.Token
	if stale {
		want, wantTok = "B", lb.Token()
	}
	if rowBy != want || rowTok != wantTok || objBy != want || objTok != wantTok {
		t.Fatalf("stored: row by %q (token %d), object by %q (token %d); want %s's with token %d", rowBy, rowTok, objBy, objTok, want, wantTok)
	}
	a.send("exit")
	if lb != nil {
		_ = lb.Release(ctx)
	}
}
