package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/redislease"
)

// examplePrograms holds the example programs built so far, by name.
var examplePrograms sync.Map // string -> *exampleProgram

type exampleProgram struct {
	once sync.Once
	path string
	err  error
}

// exampleBinary builds examples/<name> once per test binary run, into the
// directory TestMain removes at the end, and returns its path.
func exampleBinary(t *testing.T, name string) string {
	t.Helper()
	v, _ := examplePrograms.LoadOrStore(name, &exampleProgram{})
	p := v.(*exampleProgram)
	p.once.Do(func() {
		p.path = filepath.Join(binDir, name)
		out, err := exec.Command("go", "build", "-o", p.path, "github.com/fencekit/fencekit/examples/"+name).CombinedOutput()
		if err != nil {
			p.err = fmt.Errorf("go build %s: %v: %s", name, err, out)
		}
	})
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.path
}

// runExample runs examples/<name> with args and --json, and decodes the
// summary it wrote into sum. It returns the program's output and exit
// status, failing t when the program could not be run or wrote no
// summary.
func runExample(t *testing.T, name string, args []string, sum any) (out []byte, code int) {
	t.Helper()
	js := filepath.Join(t.TempDir(), "summary.json")
	out, err := exec.Command(exampleBinary(t, name), append(args, "--json", js)...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v\n%s", name, err, out)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatalf("%s exited (%d) without a summary: %v\n%s", name, code, err, out)
	}
	if err := json.Unmarshal(b, sum); err != nil {
		t.Fatalf("%s's summary: %v", name, err)
	}
	return out, code
}

// stalewriterBinary builds the demo once per test binary run.
func stalewriterBinary(t *testing.T) string { return exampleBinary(t, "stalewriter") }

// The summary the demo writes with --json (the fields this test reads).
type demoSummary struct {
	OK     bool        `json:"ok"`
	TokenA fence.Token `json:"token_a"`
	TokenB fence.Token `json:"token_b"`
	Events []struct {
		At        time.Time     `json:"at"`
		Role      string        `json:"role"`
		Kind      string        `json:"kind"`
		Token     fence.Token   `json:"token"`
		Store     string        `json:"store"`
		Accepted  bool          `json:"accepted"`
		Remaining time.Duration `json:"remaining_ns"`
		Deadline  time.Time     `json:"lease_deadline"`
		Text      string        `json:"text"`
	} `json:"events"`
	Run struct {
		Schema      string `json:"schema"`
		Table       string `json:"table"`
		Bucket      string `json:"bucket"`
		LeaseName   string `json:"lease_name"`
		RowID       string `json:"row_id"`
		ObjectKey   string `json:"object_key"`
		LeaseStore  string `json:"lease_store"`
		RedisPrefix string `json:"redis_prefix"`
		RowStore    string `json:"row_store"`
		RowDSN      string `json:"row_dsn"`
	} `json:"run"`
	KeptDirs []string `json:"kept_dirs"`
}

// runDemo runs the stalewriter demo with args (plus --keep and --json), and
// returns its exit code, its summary and its output. It removes what the
// run created when the test ends.
func runDemo(t *testing.T, args ...string) (int, demoSummary, string) {
	t.Helper()
	s3Client(t) // fail first if the S3 server is not configured
	jsonPath := filepath.Join(t.TempDir(), "summary.json")
	cmd := exec.Command(stalewriterBinary(t), append(args, "--keep", "--json", jsonPath)...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running the demo: %v\n%s", err, out)
	}
	var sum demoSummary
	b, rerr := os.ReadFile(jsonPath)
	if rerr != nil {
		t.Fatalf("demo exited %d without a summary: %v\n%s", code, rerr, out)
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("summary: %v", err)
	}
	t.Cleanup(func() { cleanUpRun(t, sum) })
	return code, sum, string(out)
}

func s3Client(t *testing.T) (*s3.Client, testenv.S3) {
	t.Helper()
	env := testenv.S3Config()
	if env.Endpoint == "" || env.AccessKey == "" || env.SecretKey == "" {
		t.Fatalf("%s, %s and %s must be set: run the tests through ./scripts/test.sh, which starts versitygw",
			testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar)
	}
	return services.NewS3Client(env), env
}

func cleanUpRun(t *testing.T, sum demoSummary) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, d := range sum.KeptDirs { // servers the demo started (etcd, ZooKeeper, S3 when not given)
		if err := os.RemoveAll(d); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	}
	if conn, err := pgx.Connect(ctx, testenv.PostgresURL()); err == nil {
		_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{sum.Run.Schema}.Sanitize()+" CASCADE")
		conn.Close(ctx)
	}
	c, _ := s3Client(t)
	_, _ = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(sum.Run.Bucket), Key: aws.String(sum.Run.ObjectKey)})
	if sum.Run.LeaseStore != "redis" {
		// PostgreSQL leases lived in the schema, dropped above; etcd and
		// ZooKeeper leases went with the servers the demo started.
		return
	}
	opt, _ := redis.ParseURL(testenv.RedisURL())
	rc := redis.NewClient(opt)
	defer rc.Close()
	if b, err := redislease.New(rc, func(o *redislease.Options) { o.Prefix = sum.Run.RedisPrefix }); err == nil {
		k := b.KeysFor(sum.Run.LeaseName)
		if n, err := rc.Del(ctx, k.Lease, k.Token).Result(); err != nil || n == 0 {
			t.Errorf("cleaning up: the run's token counter %s was not there to delete (%d, %v)", k.Token, n, err)
		}
		_ = b.Close()
	}
}

// stored reads, independently of the demo, who wrote the row and the object
// last and with which token.
func stored(t *testing.T, sum demoSummary, guarded bool) (rowBy string, rowVersion fence.Token, objBy string, objToken fence.Token) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	var v, tok int64
	if err := conn.QueryRow(ctx, "SELECT written_by, lock_version, token FROM "+pgx.Identifier{sum.Run.Schema, sum.Run.Table}.Sanitize()+" WHERE id = $1", sum.Run.RowID).
		Scan(&rowBy, &v, &tok); err != nil {
		t.Fatalf("reading the row: %v", err)
	}
	rowVersion = fence.Token(v)
	if !guarded {
		rowVersion = fence.Token(tok)
	}
	c, env := s3Client(t)
	var body []byte
	if guarded {
		g, err := blobguard.New(c, env.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := g.Get(ctx, sum.Run.ObjectKey)
		if err != nil {
			t.Fatalf("reading the object: %v", err)
		}
		body, objToken = obj.Body, obj.Token()
	} else {
		res, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(env.Bucket), Key: aws.String(sum.Run.ObjectKey)})
		if err != nil {
			t.Fatalf("reading the object: %v", err)
		}
		defer res.Body.Close()
		if err := json.NewDecoder(res.Body).Decode(&struct{}{}); err != nil {
			t.Fatal(err)
		}
	}
	if guarded {
		var ob struct {
			WrittenBy string `json:"written_by"`
		}
		if err := json.Unmarshal(body, &ob); err != nil {
			t.Fatalf("object body %q: %v", body, err)
		}
		objBy = ob.WrittenBy
	}
	return rowBy, rowVersion, objBy, objToken
}

// TestPausedClient runs the paused-client scenario with a real worker
// process frozen by SIGSTOP, over a range of TTLs and pauses, against real
// Redis, PostgreSQL and versitygw. Whatever the timing, no stale write lands
// and the stores end with the newest accepted token's data: a write of A's
// that reaches a store after B's must be rejected. When the pause is well
// within the holder's remaining validity, it keeps its lease and its writes
// succeed; when it is far past the TTL, the newer holder writes first and
// both stale writes are rejected. Just above the TTL either may reach the
// stores first; the tokens order them.
func TestPausedClient(t *testing.T) {
	type tc struct{ ttl, pause time.Duration }
	var cases []tc
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second} {
		cases = append(cases,
			tc{ttl, ttl * 3 / 10},               // well within the lease
			tc{ttl, ttl - 150*time.Millisecond}, // just below the TTL
			tc{ttl, ttl + 300*time.Millisecond}, // just above the TTL
			tc{ttl, 2*ttl + time.Second},        // far past it
		)
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("ttl=%v/pause=%v", c.ttl, c.pause), func(t *testing.T) { checkPausedRun(t, c.ttl, c.pause) })
	}
}

// TestPausedClientPostgresLeases runs the paused-client scenario with the
// leases in PostgreSQL (pglease, both modes) instead of Redis: the frozen
// holder's writes are rejected by sqlguard and blobguard all the same. (In
// session mode the server ends the frozen holder's idle session after the
// TTL, which frees its lock.)
func TestPausedClientPostgresLeases(t *testing.T) {
	for _, store := range []string{"postgres", "postgres-session"} {
		for _, pause := range []time.Duration{time.Second + 300*time.Millisecond, 3 * time.Second} {
			t.Run(fmt.Sprintf("%s/ttl=1s/pause=%v", store, pause), func(t *testing.T) {
				checkPausedRun(t, time.Second, pause, "--lease-store", store)
			})
		}
	}
}

// TestPausedClientConsensusLeases runs the paused-client scenario with the
// leases in etcd (etcdlease) and ZooKeeper (zklease), on servers the demo
// starts itself: the frozen holder's etcd lease or ZooKeeper session
// expires, B acquires with a greater token (a later revision, a later
// czxid), and A's late writes are rejected by sqlguard and blobguard.
func TestPausedClientConsensusLeases(t *testing.T) {
	for _, store := range []string{"etcd", "zookeeper"} {
		for _, pause := range []time.Duration{time.Second + 300*time.Millisecond, 3 * time.Second} {
			t.Run(fmt.Sprintf("%s/ttl=1s/pause=%v", store, pause), func(t *testing.T) {
				checkPausedRun(t, time.Second, pause, "--lease-store", store)
			})
		}
	}
}

// checkPausedRun runs the demo with worker A frozen for pause and checks
// that no stale write landed (see TestPausedClient).
func checkPausedRun(t *testing.T, ttl, pause time.Duration, extra ...string) {
	t.Helper()
	c := struct{ ttl, pause time.Duration }{ttl, pause}
	args := []string{"--ttl", c.ttl.String(), "--pause", c.pause.String()}
	farPast := c.pause >= 2*c.ttl+time.Second
	if farPast {
		// B's writes must come first for both of A's to be refused: on a
		// loaded machine B can take longer than the pause to acquire and
		// write, so A stays frozen until B has written.
		args = append(args, "--resume-after-b")
	}
	code, sum, out := runDemo(t, append(args, extra...)...)
	if code != 0 || !sum.OK {
		t.Fatalf("demo exit %d, ok=%v: a stale write landed or the run failed:\n%s", code, sum.OK, out)
	}
	var remaining time.Duration
	accepted := map[string][]fence.Token{}
	rejected := map[string][]fence.Token{}
	bWrote := map[string]time.Time{} // store -> when B's write was accepted
	for _, e := range sum.Events {
		switch {
		case e.Kind == "checked" && e.Role == "A":
			remaining = e.Remaining
		case e.Kind == "write" && e.Accepted:
			accepted[e.Role] = append(accepted[e.Role], e.Token)
			if e.Role == "B" {
				bWrote[e.Store] = e.At
			}
		case e.Kind == "write":
			rejected[e.Role] = append(rejected[e.Role], e.Token)
		}
	}
	if sum.TokenA == 0 || sum.TokenB <= sum.TokenA {
		t.Fatalf("tokens A=%d B=%d: B's must be greater", sum.TokenA, sum.TokenB)
	}
	if len(accepted["B"]) != 2 {
		t.Fatalf("B, the newest holder, must write both stores: accepted %v, rejected %v\n%s", accepted["B"], rejected["B"], out)
	}
	// A write of A's that reached a store after B's was accepted
	// there is stale and must have been rejected.
	for _, e := range sum.Events {
		if e.Kind == "write" && e.Role == "A" && e.Accepted && !bWrote[e.Store].IsZero() && bWrote[e.Store].Before(e.At) {
			t.Fatalf("%s accepted A's write (token %d) after B's (token %d)\n%s", e.Store, e.Token, sum.TokenB, out)
		}
	}
	// The stores, read independently, hold B's data with B's token.
	rowBy, rowVer, objBy, objTok := stored(t, sum, true)
	if rowBy != "B" || rowVer != sum.TokenB || objBy != "B" || objTok != sum.TokenB {
		t.Fatalf("stored: row by %q lock_version %d, object by %q token %d; want B's data with token %d", rowBy, rowVer, objBy, objTok, sum.TokenB)
	}
	switch {
	case c.pause+300*time.Millisecond < remaining:
		// Well within the lease A keeps it, and its writes land. The pause
		// is a timer of the demo's: on a loaded machine it can stretch
		// past A's validity, and B then writes first, which makes A's
		// later writes stale, as they should be. So, by the events: B is
		// not granted the lease before A's local deadline while A still
		// holds it (A releases after its writes; B's acquired event
		// follows its grant), and every write of A's that returned before
		// B had the lease (B writes only after its grant) reached its
		// store before any of B's, and must have been accepted.
		var bAcquired, aDeadline, aWrote time.Time
		for _, e := range sum.Events {
			if e.Role == "B" && e.Kind == "acquired" && bAcquired.IsZero() {
				bAcquired = e.At
			}
			if e.Role == "A" && e.Kind == "write" {
				if aDeadline.IsZero() {
					aDeadline = e.Deadline
				}
				aWrote = e.At
			}
		}
		if !bAcquired.IsZero() && bAcquired.Before(aDeadline) && bAcquired.Before(aWrote) {
			t.Fatalf("pause %v within the remaining validity %v: B was granted the lease %v before A's local deadline, while A held it\n%s",
				c.pause, remaining, aDeadline.Sub(bAcquired), out)
		}
		judged := 0
		for _, e := range sum.Events {
			if e.Role != "A" || e.Kind != "write" || !bAcquired.IsZero() && !e.At.Before(bAcquired) {
				continue
			}
			judged++
			if !e.Accepted {
				t.Fatalf("pause %v within the remaining validity %v: A's write to %s (token %d), done before B had the lease, was refused: %s\n%s",
					c.pause, remaining, e.Store, e.Token, e.Text, out)
			}
		}
		if judged == 0 {
			t.Logf("pause %v within the remaining validity %v: B had the lease before A's writes returned (the pause stretched on this machine); nothing to judge", c.pause, remaining)
		}
	case farPast:
		// B acquires at the expiry (about one TTL) and writes before A
		// wakes (--resume-after-b): both of A's writes are stale.
		if len(rejected["A"]) != 2 {
			t.Fatalf("pause %v far past the TTL %v: both of A's stale writes must be rejected; accepted %v rejected %v\n%s",
				c.pause, c.ttl, accepted["A"], rejected["A"], out)
		}
	}
	t.Logf("A's remaining validity at the pause %v; A accepted %d, rejected %d", remaining.Round(time.Millisecond), len(accepted["A"]), len(rejected["A"]))
}

// TestPausedClientUnguarded shows that the check above can fail: without the
// guards, the frozen holder's late writes overwrite the newer holder's data,
// and the demo says so with exit status 1.
func TestPausedClientUnguarded(t *testing.T) {
	code, sum, out := runDemo(t, "--ttl", "1s", "--pause", "2500ms", "--resume-after-b", "--unguarded")
	if code != 1 || sum.OK {
		t.Fatalf("unguarded demo exit %d, ok=%v; want 1 and not ok:\n%s", code, sum.OK, out)
	}
	rowBy, rowTok, _, _ := stored(t, sum, false)
	if rowBy != "A" || rowTok != sum.TokenA {
		t.Fatalf("unguarded: row by %q with token %d; the test expects A's stale write (token %d) to have overwritten B's", rowBy, rowTok, sum.TokenA)
	}
}
