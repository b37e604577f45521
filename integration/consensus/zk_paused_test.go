package consensus

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// zkHolderEvent is one line of zkholder's output.
type zkHolderEvent struct {
	At        time.Time     `json:"at"`
	Kind      string        `json:"kind"`
	Token     fence.Token   `json:"token"`
	Remaining time.Duration `json:"remaining_ns"`
	Store     string        `json:"store"`
	Accepted  bool          `json:"accepted"`
	Stale     bool          `json:"stale"`
	Text      string        `json:"text"`
}

// TestPausedHolderIsFenced freezes a real holder process with SIGSTOP right
// after it checked its lease and before it writes. When the pause outlasts
// its session, the ensemble expires the session, another client acquires
// the lease and writes the row and the object with its token; the holder,
// resumed, writes with its old token, and PostgreSQL and S3 reject both
// writes as stale. A short pause, well within the lease, is the control:
// the holder's writes land.
func TestPausedHolderIsFenced(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name     string
		outlasts bool // the pause outlasts the session
	}{{"pause-within-lease", false}, {"pause-past-session", true}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFencedStores(t)
			root := testRoot(t)
			cmd := exec.Command(helperPath(t, "zkholder"), "-servers", strings.Join(ens.Servers(), ","), "-root", root, "-name", "report",
				"-ttl", ttl.String(), "-write-delay", "1s", "-schema", fs.schema, "-row", fs.rowID, "-key", fs.key)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			events := make(chan zkHolderEvent, 64)
			go func() {
				s := bufio.NewScanner(stdout)
				for s.Scan() {
					var e zkHolderEvent
					if json.Unmarshal(s.Bytes(), &e) == nil {
						events <- e
					}
				}
				close(events)
			}()
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGCONT)
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			next := func(kind string) zkHolderEvent {
				t.Helper()
				timer := time.NewTimer(30 * time.Second)
				defer timer.Stop()
				for {
					select {
					case e, ok := <-events:
						if !ok {
							t.Fatalf("the holder exited before %q: %s", kind, stderr.String())
						}
						if e.Kind == "failed" {
							t.Fatalf("the holder failed: %s", e.Text)
						}
						if e.Kind == kind {
							return e
						}
					case <-timer.C:
						t.Fatalf("the holder did not report %q within 30s", kind)
					}
				}
			}
			acq := next("acquired")
			checked := next("checked")
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP: %v", err)
			}
			stopped := time.Now()
			var bTok fence.Token
			if tc.outlasts {
				other := newManager(t, newZKBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), ttl, lease.WithPollInterval(10*time.Second))
				l, err := other.Acquire(ctxT(t), "report")
				if err != nil {
					t.Fatalf("the other client's Acquire while the holder is frozen: %v", err)
				}
				bTok = l.Token()
				if bTok <= acq.Token {
					t.Fatalf("token %d after %d", bTok, acq.Token)
				}
				if err := fs.writeRow(ctxT(t), bTok, "B"); err != nil {
					t.Fatalf("B's row write: %v", err)
				}
				if err := fs.writeObject(ctxT(t), bTok, "B"); err != nil {
					t.Fatalf("B's object write: %v", err)
				}
				t.Logf("holder A (token %d) frozen right after its check, %v before its deadline; B acquired (token %d) %v after the freeze",
					acq.Token, checked.Remaining.Round(time.Millisecond), bTok, time.Since(stopped).Round(time.Millisecond))
				defer l.Release(ctxT(t))
			} else {
				time.Sleep(ttl * 3 / 10)
			}
			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatalf("SIGCONT: %v", err)
			}
			paused := time.Since(stopped)
			for _, store := range []string{"postgres", "s3"} {
				w := next("write")
				if w.Store != store {
					t.Fatalf("write to %s reported, want %s", w.Store, store)
				}
				switch {
				case tc.outlasts && (w.Accepted || !w.Stale):
					t.Errorf("%s accepted, or refused for another reason than a stale token, the frozen holder's write (token %d) after B's (token %d): %s", store, acq.Token, bTok, w.Text)
				case !tc.outlasts && !w.Accepted:
					t.Errorf("%s refused the holder's write after a pause of %v within its lease: %s", store, paused, w.Text)
				}
			}
			next("released")
			rowBy, rowTok, objBy, objTok := fs.stored(t)
			want, wantTok := "A", acq.Token
			if tc.outlasts {
				want, wantTok = "B", bTok
			}
			if rowBy != want || rowTok != wantTok || objBy != want || objTok != wantTok {
				t.Fatalf("stored: row by %q (%d), object by %q (%d); want %s's with token %d", rowBy, rowTok, objBy, objTok, want, wantTok)
			}
			t.Logf("paused %v; the stores hold %s's writes (token %d)", paused.Round(time.Millisecond), want, wantTok)
		})
	}
}
