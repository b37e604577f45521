package consensus

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/guarded"
	"github.com/fencekit/fencekit/internal/rig/holder"
	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

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
			fs := newResource(t)
			res, _ := json.Marshal(fs)
			root := zktest.Root(t)
			a := itest.StartHolder(t, "-store", "zookeeper", "-servers", strings.Join(ens.Servers(), ","), "-root", root, "-name", "report",
				"-ttl", ttl.String(), "-do", "commands", "-resource", string(res))
			acq := a.Next(holder.KindAcquired, 30*time.Second)
			a.Send("check")
			checked := a.Next(holder.KindChecked, 30*time.Second)
			if !checked.Valid {
				t.Fatalf("the holder's lease was not valid at its check: %s", checked.Text)
			}
			stopped := a.Signal(syscall.SIGSTOP)
			var bTok fence.Token
			if tc.outlasts {
				other := testkit.NewManager(t, newZKBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), ttl, lease.WithPollInterval(10*time.Second))
				l, err := other.Acquire(testkit.Context(t), "report")
				if err != nil {
					t.Fatalf("the other client's Acquire while the holder is frozen: %v", err)
				}
				bTok = l.Token()
				if bTok <= acq.Token {
					t.Fatalf("token %d after %d", bTok, acq.Token)
				}
				if err := guarded.WriteRow(testkit.Context(t), fs, "B", bTok); err != nil {
					t.Fatalf("B's row write: %v", err)
				}
				if err := guarded.WriteObject(testkit.Context(t), fs, "B", bTok); err != nil {
					t.Fatalf("B's object write: %v", err)
				}
				t.Logf("holder A (token %d) frozen right after its check, %v before its deadline; B acquired (token %d) %v after the freeze",
					acq.Token, checked.Deadline.Sub(checked.At).Round(time.Millisecond), bTok, time.Since(stopped).Round(time.Millisecond))
				defer l.Release(testkit.Context(t))
			} else {
				time.Sleep(ttl * 3 / 10)
			}
			a.Signal(syscall.SIGCONT)
			paused := time.Since(stopped)
			// Its write was already under way: it does not check again.
			a.Send("write")
			for _, store := range []string{"postgres", "s3"} {
				w := a.Next(holder.KindWrite, 30*time.Second)
				if w.Store != store {
					t.Fatalf("write to %s reported, want %s", w.Store, store)
				}
				switch {
				case tc.outlasts && w.Outcome != holder.Stale:
					t.Errorf("%s accepted, or refused for another reason than a stale token, the frozen holder's write (token %d) after B's (token %d): %s %s", store, acq.Token, bTok, w.Outcome, w.Text)
				case !tc.outlasts && w.Outcome != holder.Accepted:
					t.Errorf("%s refused the holder's write after a pause of %v within its lease: %s %s", store, paused, w.Outcome, w.Text)
				}
			}
			a.Send("exit")
			a.Next(holder.KindReleased, 30*time.Second)
			rowBy, rowTok, objBy, objTok := stored(t, fs)
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
