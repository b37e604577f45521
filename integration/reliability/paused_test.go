package reliability

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	holderout "github.com/fencekit/fencekit/internal/rig/holder"
	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// writerEvent is one line of the holder program's output (-do rounds).
type writerEvent = holderout.Event

// proc is one holder process (-do rounds) of a trial.
type proc struct {
	role   string
	cmd    *exec.Cmd
	events chan writerEvent
	done   chan struct{}
	err    error
	stderr strings.Builder

	mu   sync.Mutex
	seen []writerEvent
}

func startProc(t *testing.T, role string, args ...string) (*proc, error) {
	p := &proc{role: role, events: make(chan writerEvent, 256), done: make(chan struct{})}
	p.cmd = exec.Command(itest.HolderPath(t), append([]string{"-role", role}, args...)...)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			var e writerEvent
			if json.Unmarshal(s.Bytes(), &e) == nil {
				p.mu.Lock()
				p.seen = append(p.seen, e)
				p.mu.Unlock()
				select {
				case p.events <- e:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// await returns the first event for which ok is true, or an error when the
// process exits first or timeout passes.
func (p *proc) await(ok func(writerEvent) bool, timeout time.Duration) (writerEvent, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e := <-p.events:
			if e.Kind == "failed" {
				return e, fmt.Errorf("%s failed: %s", p.role, e.Text)
			}
			if ok(e) {
				return e, nil
			}
		case <-p.done:
			// Events it wrote before it exited come first.
		drain:
			for {
				select {
				case e := <-p.events:
					if ok(e) {
						return e, nil
					}
				default:
					break drain
				}
			}
			return writerEvent{}, fmt.Errorf("%s exited (%v) early: %s", p.role, p.err, p.stderr.String())
		case <-timer.C:
			return writerEvent{}, fmt.Errorf("%s: nothing after %v", p.role, timeout)
		}
	}
}

func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%s exited with %v: %s", p.role, p.err, p.stderr.String())
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %v", p.role, timeout)
	}
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) writes() []writerEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []writerEvent
	for _, e := range p.seen {
		if e.Kind == "write" {
			out = append(out, e)
		}
	}
	return out
}

// pauseKind names how a trial's pause compares with the TTL.
var pauseKinds = []struct {
	name   string
	factor float64
}{
	{"shorter", 0.5}, {"equal", 1}, {"longer", 1.5}, {"much-longer", 4},
}

// trialStats are the counts of one or more trials.
type trialStats struct {
	Trials, Violations               int
	ByPause                          map[string]int
	Writes, Accepted, Stale, Unknown int
	Errors                           int
	LateWrites, LateRejected         int // writes of the paused holder after a newer holder wrote first
	Reckless                         int
	Takeovers                        int // trials in which a newer holder wrote before the paused one resumed
	Void                             int // trials in which a careful holder lost its lease before it was frozen
	failures                         []string
}

func (s *trialStats) add(o trialStats) {
	s.Trials += o.Trials
	s.Violations += o.Violations
	s.Writes += o.Writes
	s.Accepted += o.Accepted
	s.Stale += o.Stale
	s.Unknown += o.Unknown
	s.Errors += o.Errors
	s.LateWrites += o.LateWrites
	s.LateRejected += o.LateRejected
	s.Reckless += o.Reckless
	s.Takeovers += o.Takeovers
	s.Void += o.Void
	if s.ByPause == nil {
		s.ByPause = map[string]int{}
	}
	for k, v := range o.ByPause {
		s.ByPause[k] += v
	}
	s.failures = append(s.failures, o.failures...)
}

// pausedRig is what the trials of one test share.
type pausedRig struct {
	t      *testing.T
	pg     *pgEnv
	pool   *pgxpool.Pool
	s3     *s3.Client
	bucket string
	prefix string // Redis key prefix
	objPfx string // S3 key prefix
	ttl    time.Duration
}

// TestPausedHoldersRandomized runs trials in which a real process holding
// a Redis lease is frozen with SIGSTOP, for a random time shorter than,
// equal to, longer or much longer than the TTL, while two more processes
// wait for the lease, take it over and write; then the frozen one resumes
// and writes too (recklessly in half the trials: without looking at its
// lease). All write a PostgreSQL row (sqlguard.Table), a ledger row inside
// sqlguard.Guard.BeginFunc and an S3 object (blobguard). After each trial
// the stores' own records are checked: the row's audit trail (kept by a
// trigger) and the ledger show tokens that never go down and every
// accepted write, an observer polling the object saw its token never go
// down, the final states carry the newest accepted token, and no write
// was accepted after a write with a newer token had been acknowledged.
//
// RELIABILITY_TRIALS (default 100) sets the number of trials,
// RELIABILITY_SEED the seed (logged), RELIABILITY_PARALLEL how many run at
// once (default 4); scripts/soak.sh runs 1,000 and more.
func TestPausedHoldersRandomized(t *testing.T) {
	started := time.Now()
	seed := seedFor(t)
	trials := envInt("RELIABILITY_TRIALS", 100)
	parallel := envInt("RELIABILITY_PARALLEL", 4)
	rig := newPausedRig(t)

	var (
		mu    sync.Mutex
		total trialStats
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= trials {
					return
				}
				st := rig.trial(seed, i)
				mu.Lock()
				total.add(st)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, f := range total.failures {
		t.Error(f)
	}
	t.Logf("paused-holder trials: %d (void: %d; by pause: %v; reckless %d), takeovers before resume %d; writes %d: accepted %d, stale %d, unknown %d, errors %d; late writes of the paused holder %d, rejected %d; violations %d",
		total.Trials, total.Void, total.ByPause, total.Reckless, total.Takeovers, total.Writes, total.Accepted, total.Stale, total.Unknown, total.Errors, total.LateWrites, total.LateRejected, total.Violations)
	report(t, figures{
		Check: "paused holders", Trials: total.Trials, Operations: total.Writes, Violations: total.Violations, Seed: seed,
		Outcomes: map[string]int{"accepted": total.Accepted, "stale": total.Stale, "unknown": total.Unknown, "error": total.Errors,
			"late-writes": total.LateWrites, "late-rejected": total.LateRejected, "takeovers-before-resume": total.Takeovers, "void-trials": total.Void},
		Faults:  map[string]int{"sigstop-shorter": total.ByPause["shorter"], "sigstop-equal": total.ByPause["equal"], "sigstop-longer": total.ByPause["longer"], "sigstop-much-longer": total.ByPause["much-longer"]},
		Seconds: time.Since(started).Seconds(),
	})
	if total.Violations == 0 && total.Trials >= 20 && (total.LateWrites == 0 || total.Takeovers == 0) {
		t.Errorf("no trial had a stale holder write after a takeover: the trials tested nothing")
	}
}

func newPausedRig(t *testing.T) *pausedRig {
	pg := newPGEnv(t)
	pg.exec(`CREATE TABLE rows (k text PRIMARY KEY, v text NOT NULL,
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`)
	// The store's own record of every write to the rows: appended by a
	// trigger in the writing transaction, so it commits or rolls back
	// with the write, and in the order the row lock admitted the writers.
	pg.exec(`CREATE TABLE rows_audit (id bigserial PRIMARY KEY, k text NOT NULL, old_lv bigint, new_lv bigint NOT NULL, v text NOT NULL)`)
	pg.exec(`CREATE FUNCTION rows_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO rows_audit (k, old_lv, new_lv, v)
			VALUES (NEW.k, CASE WHEN TG_OP = 'UPDATE' THEN OLD.lock_version END, NEW.lock_version, NEW.v);
			RETURN NEW;
		END $$`)
	pg.exec(`CREATE TRIGGER rows_audit AFTER INSERT OR UPDATE ON rows FOR EACH ROW EXECUTE FUNCTION rows_audit()`)
	pg.exec(`CREATE TABLE ledger (id bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL, writer text NOT NULL)`)
	env := s3Env(t)
	return &pausedRig{
		t: t, pg: pg, pool: pg.pool("", 4), s3: s3Client(t, newHTTPTransport(t)), bucket: env.Bucket,
		prefix: redistest.Prefix(t), objPfx: "reliability/paused/" + randomHex(6) + "/",
		ttl: time.Duration(envInt("RELIABILITY_TTL_MS", 200)) * time.Millisecond,
	}
}

// trial runs trial i of the seed and returns its counts; a violation or a
// trial that could not run is in its failures.
func (rig *pausedRig) trial(seed uint64, i int) (st trialStats) {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	kind := pauseKinds[r.IntN(len(pauseKinds))]
	pause := time.Duration(float64(rig.ttl) * kind.factor * (0.9 + 0.2*r.Float64()))
	reckless := r.IntN(2) == 0
	name := fmt.Sprintf("trial-%d-%d", seed, i)
	objKey := rig.objPfx + name
	st.Trials = 1
	st.ByPause = map[string]int{kind.name: 1}
	if reckless {
		st.Reckless = 1
	}
	failf := func(format string, args ...any) trialStats {
		st.failures = append(st.failures, fmt.Sprintf("trial %d (seed %d, pause %v %s, reckless %v): ", i, seed, pause.Round(time.Millisecond), kind.name, reckless)+fmt.Sprintf(format, args...))
		return st
	}
	interval := rig.ttl / 4
	common := []string{"-store", "redis", "-redis", testenv.RedisURL(), "-prefix", rig.prefix, "-name", name, "-ttl", rig.ttl.String(),
		"-do", "rounds", "-write-timeout", "5s", "-ledger", rig.pg.schema, "-row", name, "-object", objKey}
	aArgs := append(append([]string(nil), common...), "-rounds", "8", "-interval", interval.String())
	if reckless {
		aArgs = append(aArgs, "-reckless")
	}
	a, err := startProc(rig.t, "A", aArgs...)
	if err != nil {
		return failf("start A: %v", err)
	}
	defer a.kill()
	if _, err := a.await(func(e writerEvent) bool { return e.Kind == "acquired" }, 30*time.Second); err != nil {
		return failf("%v", err)
	}
	// Freeze A at a random point of its second round or after it: in a
	// write, between writes, or asleep.
	if e, err := a.await(func(e writerEvent) bool { return e.Kind == "write" && e.Round == 1 || e.Kind == "lost" }, 30*time.Second); err != nil {
		return failf("%v", err)
	} else if e.Kind == "lost" {
		// A careful holder that lost its lease before the freeze (a
		// loaded machine can starve its renewals) stops writing: the
		// trial tests nothing.
		st.Void = 1
		return st
	}
	time.Sleep(time.Duration(r.Int64N(int64(interval))))

	obs := rig.observe(objKey)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return failf("SIGSTOP A: %v", err)
	}
	stopped := time.Now()
	var others []*proc
	for _, role := range []string{"B", "C"} {
		p, err := startProc(rig.t, role, append(append([]string(nil), common...), "-rounds", "3", "-interval", (rig.ttl/5).String())...)
		if err != nil {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
			return failf("start %s: %v", role, err)
		}
		defer p.kill()
		others = append(others, p)
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	resumed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return failf("SIGCONT A: %v", err)
	}
	for _, p := range append([]*proc{a}, others...) {
		if err := p.wait(60 * time.Second); err != nil {
			obs.stop()
			return failf("%v", err)
		}
	}
	objTokens := obs.stop()

	// What the processes said.
	var all []writerEvent
	for _, p := range append([]*proc{a}, others...) {
		all = append(all, p.writes()...)
	}
	newest := map[string]fence.Token{} // per store: the newest accepted token
	firstNewer := map[string]int64{}
	for _, e := range all {
		st.Writes++
		switch e.Outcome {
		case "accepted":
			st.Accepted++
			newest[e.Store] = max(newest[e.Store], e.Token)
		case "stale":
			st.Stale++
		case "unknown":
			st.Unknown++
		default:
			st.Errors++
			return failf("%s's write to %s failed: %s", e.Role, e.Store, e.Text)
		}
	}
	for _, e := range all {
		if e.Role != "A" && e.Outcome == "accepted" && (firstNewer[e.Store] == 0 || e.End.UnixNano() < firstNewer[e.Store]) {
			firstNewer[e.Store] = e.End.UnixNano()
		}
	}
	if t := firstNewer["pg-row"]; t != 0 && t < resumed.UnixNano() {
		st.Takeovers = 1
	}
	for _, e := range a.writes() {
		if t := firstNewer[e.Store]; t != 0 && e.Start.UnixNano() > t {
			st.LateWrites++
			if e.Outcome == "stale" {
				st.LateRejected++
			}
		}
	}

	// No write accepted after a write with a newer token was acknowledged.
	for _, e1 := range all {
		for _, e2 := range all {
			if e1.Store == e2.Store && e1.Outcome == "accepted" && e2.Outcome == "accepted" && e2.Token > e1.Token && e2.End.Before(e1.Start) {
				st.Violations++
				return failf("%s accepted %s's write with token %d at %d, after %s's write with token %d was acknowledged at %d",
					e1.Store, e1.Role, e1.Token, e1.Start.UnixNano(), e2.Role, e2.Token, e2.End.UnixNano())
			}
		}
	}
	// The stores' own records.
	if msg := rig.checkRecords(name, all, newest); msg != "" {
		st.Violations++
		return failf("%s", msg)
	}
	for j := 1; j < len(objTokens); j++ {
		if objTokens[j] < objTokens[j-1] {
			st.Violations++
			return failf("the object's token went down from %d to %d (observed tokens %v)", objTokens[j-1], objTokens[j], objTokens)
		}
	}
	if tok, ok := rig.objectToken(objKey); !ok || !finalOK(fence.Token(tok), "s3", all, newest) {
		st.Violations++
		return failf("the object holds token %d (found %v), the newest accepted write to it had %d", tok, ok, newest["s3"])
	}
	return st
}

// checkRecords checks the row's audit trail and the ledger of resource
// name against the accepted writes.
func (rig *pausedRig) checkRecords(name string, all []writerEvent, newest map[string]fence.Token) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type rec struct {
		old    *int64
		lv     int64
		writer string
	}
	read := func(q string) ([]rec, error) {
		rows, err := rig.pool.Query(ctx, q, name)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []rec
		for rows.Next() {
			var r rec
			if err := rows.Scan(&r.old, &r.lv, &r.writer); err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		return out, rows.Err()
	}
	for _, store := range []struct{ name, q string }{
		{"pg-row", "SELECT old_lv, new_lv, v FROM rows_audit WHERE k = $1 ORDER BY id"},
		{"pg-ledger", "SELECT NULL::bigint, token, writer FROM ledger WHERE resource = $1 ORDER BY id"},
	} {
		recs, err := read(store.q)
		if err != nil {
			return fmt.Sprintf("reading %s: %v", store.name, err)
		}
		have := map[string]bool{}
		var tokens []int64
		for j, r := range recs {
			have[r.writer] = true
			tokens = append(tokens, r.lv)
			if r.old != nil && *r.old > r.lv {
				return fmt.Sprintf("%s: write %q set lock_version %d over %d", store.name, r.writer, r.lv, *r.old)
			}
			if j > 0 && r.lv < recs[j-1].lv {
				return fmt.Sprintf("%s: the store accepted token %d (%q) after token %d (%q): tokens %v", store.name, r.lv, r.writer, recs[j-1].lv, recs[j-1].writer, tokens)
			}
		}
		for _, e := range all {
			if e.Store != store.name {
				continue
			}
			switch {
			case e.Outcome == "accepted" && !have[e.Value]:
				return fmt.Sprintf("%s: %s's accepted write %q is not in the store's record (lost)", store.name, e.Role, e.Value)
			case e.Outcome == "stale" && have[e.Value]:
				return fmt.Sprintf("%s: %s's write %q was reported rejected but is in the store's record", store.name, e.Role, e.Value)
			}
		}
		if len(tokens) > 0 && !finalOK(fence.Token(tokens[len(tokens)-1]), store.name, all, newest) {
			return fmt.Sprintf("%s: the last record has token %d, the newest accepted write %d", store.name, tokens[len(tokens)-1], newest[store.name])
		}
	}
	return ""
}

// objectToken reads the token in the header of the object at key, with a
// plain GetObject (not through the guard).
func (rig *pausedRig) objectToken(key string) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := rig.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(rig.bucket), Key: aws.String(key)})
	if err != nil {
		return 0, false
	}
	defer out.Body.Close()
	var h [30]byte
	if _, err := io.ReadFull(out.Body, h[:]); err != nil || string(h[:4]) != "FKBG" {
		return 0, false
	}
	return binary.BigEndian.Uint64(h[6:14]), true
}

// objObserver polls an object's token until stopped.
type objObserver struct {
	cancel context.CancelFunc
	done   chan []uint64
}

func (rig *pausedRig) observe(key string) *objObserver {
	ctx, cancel := context.WithCancel(context.Background())
	o := &objObserver{cancel: cancel, done: make(chan []uint64, 1)}
	go func() {
		var seen []uint64
		for ctx.Err() == nil {
			if tok, ok := rig.objectToken(key); ok && (len(seen) == 0 || seen[len(seen)-1] != tok) {
				seen = append(seen, tok)
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		o.done <- seen
	}()
	return o
}

func (o *objObserver) stop() []uint64 {
	o.cancel()
	return <-o.done
}

// finalOK reports whether tok may be the token a store ends with: the
// newest accepted one, or a newer one of a write whose outcome was unknown.
func finalOK(tok fence.Token, store string, all []writerEvent, newest map[string]fence.Token) bool {
	if tok == newest[store] {
		return true
	}
	return tok > newest[store] && slices.ContainsFunc(all, func(e writerEvent) bool {
		return e.Store == store && e.Outcome == "unknown" && e.Token == tok
	})
}
