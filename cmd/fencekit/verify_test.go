package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The tests of fencekit verify: a run passes on every lease store with
// every guard, on the real stores; it catches each bug a test plants in
// its workers (test equipment, plantVar); --recheck finds a violation
// written into a history; the scratch resource is removed on Ctrl-C and a
// killed run's is swept by a later one.

// guardSetup is where a test's verify run writes: its flags and
// variables, and a check that the run's scratch resource is gone.
type guardSetup struct {
	flags []string
	env   map[string]string
	gone  func(t *testing.T, s scratch) bool
}

// pgGuard: sqlguard on the shared PostgreSQL, in a schema of the test's
// own.
func pgGuard(t *testing.T) guardSetup {
	schema, db := newSchema(t)
	return guardSetup{
		flags: []string{"--guard", "postgres", "--guard-schema", schema},
		env:   map[string]string{databaseURLVar: testenv.PostgresURL()},
		gone: func(t *testing.T, s scratch) bool {
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
				WHERE n.nspname = $1 AND c.relname = $2`, schema, s.Name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0 && s.Schema == schema
		},
	}
}

// mysqlGuard: dbguard on the machine's MariaDB, in a database of the
// test's own.
func mysqlGuard(t *testing.T) guardSetup {
	cfg, admin := mysqlDatabase(t)
	name := cfg.DBName
	return guardSetup{
		flags: []string{"--guard", "mysql", "--guard-url", cfg.FormatDSN()},
		gone: func(t *testing.T, s scratch) bool {
			var n int
			if err := admin.QueryRow("SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?", name, s.Name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0 && s.Schema == name
		},
	}
}

// sqliteGuard: dbguard on a SQLite file of the test's own.
func sqliteGuard(t *testing.T) guardSetup {
	file := filepath.Join(t.TempDir(), "app.db")
	return guardSetup{
		flags: []string{"--guard", "sqlite", "--guard-url", file},
		gone: func(t *testing.T, s scratch) bool {
			db, err := sql.Open("sqlite", file)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = ?", s.Name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		},
	}
}

// s3Guard: blobguard on the S3-compatible server (versitygw), under a
// prefix of the run's own in the test bucket.
func s3Guard(t *testing.T) guardSetup {
	cfg := testenv.S3Config()
	if cfg.Endpoint == "" {
		t.Fatalf("%s is not set: these tests need an S3-compatible server; run ./scripts/test.sh, or `. scripts/services.sh && ensure_s3`", testenv.S3EndpointVar)
	}
	c := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(cfg.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, "")})
	return guardSetup{
		flags: []string{"--guard", "s3", "--bucket", cfg.Bucket},
		env:   map[string]string{"FENCE_S3_ENDPOINT": cfg.Endpoint, "FENCE_S3_ACCESS_KEY": cfg.AccessKey, "FENCE_S3_SECRET_KEY": cfg.SecretKey},
		gone: func(t *testing.T, s scratch) bool {
			out, err := c.ListObjectsV2(testkit.Context(t), &s3.ListObjectsV2Input{Bucket: aws.String(cfg.Bucket), Prefix: aws.String(s.Name + "/")})
			if err != nil {
				t.Fatal(err)
			}
			return len(out.Contents) == 0
		},
	}
}

// dynamoGuard: dynamoguard on DynamoDB Local, in a scratch table.
func dynamoGuard(t *testing.T) guardSetup {
	ep, err := dynamotest.Endpoint()
	if err != nil {
		t.Fatal(err)
	}
	return guardSetup{
		flags: []string{"--guard", "dynamodb"},
		env:   map[string]string{dynamoEndpoint: ep, "AWS_ACCESS_KEY_ID": "fencekit", "AWS_SECRET_ACCESS_KEY": "fencekit"},
		gone: func(t *testing.T, s scratch) bool {
			_, err := dynamotest.Client(t).DescribeTable(testkit.Context(t), &dynamodb.DescribeTableInput{TableName: aws.String(s.Name)})
			var nf *dtypes.ResourceNotFoundException
			if err != nil && !errors.As(err, &nf) {
				t.Fatal(err)
			}
			return err != nil
		},
	}
}

func sharedRedis(t *testing.T) leaseStore {
	return redisStore(t, testenv.RedisURL(), "standalone", func(t *testing.T) redis.UniversalClient { return redistest.Shared(t) })
}

// merge returns the union of the maps (later ones win).
func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// verifyRun runs fencekit verify on st and g with args, and returns its
// exit status, output and the history it wrote into its own directory
// (nil when it wrote none).
func runVerifyOn(t *testing.T, ctx context.Context, st leaseStore, g guardSetup, env map[string]string, args ...string) (int, string, string, *verifyHistory, string) {
	t.Helper()
	dir := t.TempDir()
	all := append(append(append([]string{"verify"}, st.flags...), g.flags...), append(args, "--out", dir)...)
	code, stdout, stderr := leaseStore{env: merge(st.env, g.env, env)}.cli(t, ctx, nil, all...)
	files, _ := filepath.Glob(filepath.Join(dir, "verify-*.json"))
	if len(files) != 1 {
		return code, stdout, stderr, nil, ""
	}
	h, err := readHistory(files[0])
	if err != nil {
		t.Fatalf("the history the run wrote: %v", err)
	}
	return code, stdout, stderr, h, files[0]
}

// recheckCLI runs fencekit verify --recheck path.
func recheckCLI(t *testing.T, path string, args ...string) (int, string, string) {
	t.Helper()
	return leaseStore{}.cli(t, testkit.Context(t), nil, append([]string{"verify", "--recheck", path}, args...)...)
}

// TestVerifyOnEveryStore: a short run with every fault verify injects
// itself passes on each lease store, each with a guard (every guard at
// least once); the history is checked again by --recheck, the report
// shows the timeline, and the scratch resource is gone.
func TestVerifyOnEveryStore(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) leaseStore
		guard func(t *testing.T) guardSetup
		ttl   string
		run   string
	}{
		{"redis+mysql", sharedRedis, mysqlGuard, "500ms", "3s"},
		// The workers' dialer reaches the nodes the cluster client finds.
		{"redis-cluster+sqlite", redisClusterStore, sqliteGuard, "500ms", "3s"},
		{"postgres+postgres", func(t *testing.T) leaseStore { return postgresStore(t, false) }, pgGuard, "500ms", "3s"},
		{"postgres-session+sqlite", func(t *testing.T) leaseStore { return postgresStore(t, true) }, sqliteGuard, "500ms", "3s"},
		// etcd's shortest TTL is 2 s (etcdlease.DefaultMinTTL): the default,
		// and a run of three TTLs.
		{"etcd+s3", etcdStore, s3Guard, "", "6s"},
		{"zookeeper+postgres", zkStore, pgGuard, "500ms", "3s"},
		{"dynamodb+dynamodb", dynamoStore, dynamoGuard, "500ms", "3s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, g := tc.store(t), tc.guard(t)
			// At load a short run can see a single grant: it goes on until
			// the lease changed hands (--min-grants 2).
			args := []string{"--duration", tc.run, "--min-grants", "2", "--fault-interval", "400ms"}
			if tc.ttl != "" {
				args = append(args, "--ttl", tc.ttl)
			}
			code, stdout, stderr, h, path := runVerifyOn(t, testkit.Context(t), st, g, nil, args...)
			if code != exitOK || !strings.Contains(stdout, "PASSED: no violation") || h == nil {
				t.Fatalf("verify = %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			c := countHistory(h)
			if len(h.Grants) < 2 || c.Accepted == 0 || len(h.Faults) == 0 {
				t.Fatalf("the run tested too little: %d grants, %d writes accepted, %d faults\n%s", len(h.Grants), c.Accepted, len(h.Faults), stdout)
			}
			if code, out, errOut := recheckCLI(t, path); code != exitOK || !strings.Contains(out, "PASSED") {
				t.Fatalf("--recheck of a passing run = %d, %q, %q", code, out, errOut)
			}
			page, err := os.ReadFile(strings.TrimSuffix(path, ".json") + ".html")
			if err != nil || !strings.Contains(string(page), "<svg") || !strings.Contains(string(page), "PASSED") {
				t.Fatalf("the report: %v\n%.500s", err, page)
			}
			if !g.gone(t, h.Run.Scratch) {
				t.Fatalf("the scratch resource %+v is still there after the run", h.Run.Scratch)
			}
			t.Logf("%s", strings.SplitN(stdout, "\n", 2)[0])
		})
	}
}

// TestVerifyMinGrants: --min-grants keeps the workers going past
// --duration until the lease was granted that many times (three grants
// within 300 ms, each holder working 0.2-1.5 TTL of 500 ms, are next to
// impossible); a run that reaches four times --duration first ends there
// and says so.
func TestVerifyMinGrants(t *testing.T) {
	const want = 3
	st, g := sharedRedis(t), sqliteGuard(t)
	code, stdout, stderr, h, _ := runVerifyOn(t, testkit.Context(t), st, g, nil,
		"--duration", "300ms", "--ttl", "500ms", "--min-grants", fmt.Sprint(want), "--faults", "none")
	if code != exitOK || h == nil {
		t.Fatalf("verify = %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	ran, grants := time.Duration(h.Run.DurationNS), len(h.Grants)
	extended := strings.Contains(stdout+stderr, fmt.Sprintf("going on until %d (--min-grants)", want))
	short := strings.Contains(stdout+stderr, fmt.Sprintf("fewer than --min-grants %d", want))
	switch {
	case short:
		if grants >= want || ran < 4*300*time.Millisecond {
			t.Fatalf("said it fell short, with %d grants in %v:\n%s%s", grants, ran, stdout, stderr)
		}
	case grants < want:
		t.Fatalf("ended with %d grants in %v (extended: %v) without saying it fell short:\n%s%s", grants, ran, extended, stdout, stderr)
	}
	t.Logf("%d grants in %v (extended %v, short %v)", grants, ran, extended, short)
}

// TestVerifyCatchesPlantedBugs: with a bug planted in its workers, a run
// fails (exit status 3) naming the violation, and --recheck of its history
// fails the same way. Pauses fall between a holder's reading of its lease
// and its write about twice a second: the moment each of these bugs needs.
func TestVerifyCatchesPlantedBugs(t *testing.T) {
	for _, tc := range []struct{ plant, want string }{
		{plantNoCompare, vWrites},
		{plantGrantHeld, vExclusion},
		{plantPastDeadline, vDeadline},
	} {
		t.Run(tc.plant, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr, h, path := runVerifyOn(t, testkit.Context(t), sharedRedis(t), pgGuard(t), map[string]string{plantVar: tc.plant},
				"--duration", "4s", "--ttl", "300ms", "--faults", "stop", "--fault-interval", "450ms")
			if code != exitViolation || !strings.Contains(firstLine(stdout), tc.want+": ") || h == nil {
				t.Fatalf("verify with %s planted = %d; want %d naming %q\nstdout:\n%s\nstderr:\n%s", tc.plant, code, exitViolation, tc.want, stdout, stderr)
			}
			if h.Run.Plant != tc.plant || !strings.Contains(stderr, "TEST EQUIPMENT") || !strings.Contains(stdout, "test equipment") {
				t.Fatalf("the run did not say that a bug was planted: plant %q\nstdout:\n%s\nstderr:\n%s", h.Run.Plant, stdout, stderr)
			}
			if code, out, _ := recheckCLI(t, path); code != exitViolation || !strings.Contains(firstLine(out), tc.want+": ") {
				t.Fatalf("--recheck of the run's history = %d, %q; want %d naming %q", code, out, exitViolation, tc.want)
			}
			page, err := os.ReadFile(strings.TrimSuffix(path, ".json") + ".html")
			if err != nil || !strings.Contains(string(page), "FAILED") || !strings.Contains(string(page), `class="bad"`) {
				t.Fatalf("the report does not point at the violation: %v", err)
			}
			t.Logf("%s", strings.Join(strings.SplitN(stdout, "\n", 3)[:2], "\n"))
		})
	}
}

func firstLine(s string) string { return strings.SplitN(s, "\n", 2)[0] }

// sampleHistory is a history that passes: two grants one after the
// other, each writing once, the second's write the final state.
func sampleHistory() *verifyHistory {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	return &verifyHistory{Format: historyFormat,
		Run: runInfo{ID: "sample", Lease: "fencekit-verify-sample", DurationNS: ms(100), RequestedNS: ms(100), TTLNS: ms(50), Store: "redis", StoreDesc: "redis", GuardDesc: "PostgreSQL"},
		Grants: []grantRec{
			{Worker: "w1", Token: 7, Acquired: ms(0), LastValid: ms(20), Deadline: ms(60), Ended: ms(21), How: endReleased},
			{Worker: "w2", Token: 9, Acquired: ms(22), LastValid: ms(40), Deadline: ms(80), Ended: ms(41), How: endReleased},
		},
		Writes: []writeRec{
			{Worker: "w1", Token: 7, Value: "w1/7/0", Checked: ms(5), Call: ms(6), Return: ms(7), Outcome: fence.Accepted},
			{Worker: "w2", Token: 9, Value: "w2/9/0", Checked: ms(25), Call: ms(26), Return: ms(27), Outcome: fence.Accepted},
			{Worker: "w1", Token: 7, Value: "w1/7/1", Checked: ms(19), Call: ms(30), Return: ms(31), Outcome: fence.Rejected, Current: 9},
		},
		Final: stateRec{Token: 9, Value: "w2/9/0"},
	}
}

// TestRecheckFindsViolationsInAHistory: --recheck of a recorded history
// finds each kind of violation written into it, names it and exits 3; a
// history it cannot judge (the clock was stepped, the final state was not
// read) exits 1; a file that is no history is refused.
func TestRecheckFindsViolationsInAHistory(t *testing.T) {
	t.Parallel()
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	for _, tc := range []struct {
		name   string
		plant  func(h *verifyHistory)
		code   int
		want   string
		report string // what the report marks
	}{
		{name: "as recorded", plant: func(*verifyHistory) {}, code: exitOK, want: "PASSED: no violation in 2 grants (2 read valid) and 3 writes (2 accepted, 1 stale, 0 unknown, 0 failed)"},
		{name: "a grant made while another was valid", code: exitViolation, want: "1. " + vExclusion + ": grant g1 (worker w2, token 9) was granted at 0.022s while grant g0 (worker w1, token 7) was still valid",
			plant: func(h *verifyHistory) { h.Grants[0].LastValid = ms(23) }, report: `id="g1" class="bad"`},
		{name: "a token that went back", code: exitViolation, want: vTokens + ": grant g1 (worker w2) got token 6",
			plant: func(h *verifyHistory) { h.Grants[1].Token = 6; h.Writes[1].Token = 6 }},
		{name: "a holder valid past its deadline", code: exitViolation, want: vDeadline + ": worker w1 read grant g0 (token 7) valid at 0.020s, 5ms after its own deadline 0.015s",
			plant: func(h *verifyHistory) { h.Grants[0].Deadline = ms(15) }},
		{name: "a stale write accepted", code: exitViolation, want: vWrites + ": (a) write w2 (token 7",
			plant: func(h *verifyHistory) { h.Writes[2].Outcome, h.Writes[2].Current = fence.Accepted, 0 }, report: `id="w2" class="bad"`},
		{name: "an acknowledged write lost", code: exitViolation, want: vLost + ": (c) final token 7 is below the greatest accepted token 9",
			plant: func(h *verifyHistory) { h.Final = stateRec{Token: 7, Value: "w1/7/0"} }},
		{name: "a rejection naming a token never stored", code: exitViolation, want: vStale + ": (b) write w2",
			plant: func(h *verifyHistory) { h.Writes[2].Current = 8 }},
		{name: "the clock was stepped", code: exitFail, want: "INCONCLUSIVE: the system clock was stepped by 1s",
			plant: func(h *verifyHistory) { h.Run.ClockDriftNS = int64(time.Second) }},
		{name: "the final state was not read", code: exitFail, want: "INCONCLUSIVE: the final state of the scratch resource could not be read (connection refused)",
			plant: func(h *verifyHistory) { h.FinalError, h.Final = "connection refused", stateRec{} }},
		{name: "no grant", code: exitFail, want: "INCONCLUSIVE: no worker was granted the lease",
			plant: func(h *verifyHistory) { h.Grants, h.Writes, h.Final = nil, nil, stateRec{} }},
		{name: "no write accepted", code: exitFail, want: "INCONCLUSIVE: no write was accepted",
			plant: func(h *verifyHistory) {
				for i := range h.Writes {
					h.Writes[i].Outcome, h.Writes[i].Current = fence.Failed, 0
				}
				h.Final = stateRec{}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := sampleHistory()
			tc.plant(h)
			path := filepath.Join(t.TempDir(), "verify-sample.json")
			if err := os.WriteFile(path, historyJSON(h), 0o644); err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			code, stdout, stderr := recheckCLI(t, path, "--out", out)
			if code != tc.code || !strings.Contains(stdout, tc.want) {
				t.Fatalf("--recheck = %d\n%s%s\nwant %d and %q", code, stdout, stderr, tc.code, tc.want)
			}
			page, err := os.ReadFile(filepath.Join(out, "verify-sample-recheck.html"))
			if err != nil || tc.report != "" && !strings.Contains(string(page), tc.report) {
				t.Fatalf("the report (%v) does not mark %q", err, tc.report)
			}
		})
	}
	for _, bad := range []struct{ text, want string }{
		{"{", "not a fencekit verify history"},
		{`{"format": "fencekit-verify/9"}`, `format "fencekit-verify/9"`},
		{`{"format": "fencekit-verify/1", "writes": [{"outcome": "maybe"}]}`, `outcome "maybe"`},
	} {
		path := filepath.Join(t.TempDir(), "bad.json")
		if err := os.WriteFile(path, []byte(bad.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if code, _, stderr := recheckCLI(t, path); code != exitFail || !strings.Contains(stderr, bad.want) {
			t.Errorf("--recheck of %q = %d, %q; want %q", bad.text, code, stderr, bad.want)
		}
	}
	if code, _, stderr := recheckCLI(t, filepath.Join(t.TempDir(), "missing.json")); code != exitFail || !strings.Contains(stderr, "no such file") {
		t.Errorf("--recheck of a missing file = %d, %q", code, stderr)
	}
}

// TestVerifyInterruptedCleansUpAndSweeps: a run finds and removes the
// scratch tables of earlier runs whose time is past (and only those); cut
// short by its context (Ctrl-C), it stops its workers, still writes its
// report of what ran, removes its own scratch table and exits 1.
func TestVerifyInterruptedCleansUpAndSweeps(t *testing.T) {
	t.Parallel()
	g := pgGuard(t)
	schema := g.flags[3]
	db, err := sql.Open("pgx", testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dead := newScratch(time.Now().Add(-time.Minute), "dead")
	live := newScratch(time.Now().Add(time.Hour), "live")
	for _, s := range []scratch{dead, live} {
		if _, err := db.Exec("CREATE TABLE " + schema + "." + s.Name + " (k text PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
	}
	// Interrupted once the run is under way, whatever its start took: its
	// fault loop has begun (a partition hook, which does nothing but note
	// that it ran, is run only from there) and a worker's write has landed
	// in the run's scratch table (a worker reports its grant before it
	// writes, so the history of what ran holds that grant).
	hookLog := filepath.Join(t.TempDir(), "hook.log")
	ctx, cancel := context.WithCancel(testkit.Context(t))
	defer cancel()
	landed := make(chan fence.Token, 1)
	go func() {
		tok := firstLandedWrite(ctx, db, schema, dead.Name, live.Name)
		for ctx.Err() == nil {
			if _, err := os.Stat(hookLog); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		landed <- tok
		cancel()
	}()
	code, stdout, stderr, h, _ := runVerifyOn(t, ctx, sharedRedis(t), g, nil, "--duration", "1m", "--ttl", "500ms",
		"--hook-partition", "echo $FENCEKIT_VERIFY_EVENT >> '"+hookLog+"'")
	cancel()
	tok := <-landed
	if tok == fence.None {
		t.Fatalf("the run ended before a write landed in its scratch table = %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if code != exitFail || !strings.Contains(stdout, "INTERRUPTED: no violation in what ran") || h == nil || !h.Run.Interrupted {
		t.Fatalf("an interrupted run = %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "removed "+schema+"."+dead.Name+", left by an earlier run") || strings.Contains(stderr, live.Name) {
		t.Fatalf("the sweep: %s", stderr)
	}
	exists := func(name string) bool {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2`, schema, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if exists(dead.Name) || !exists(live.Name) || !g.gone(t, h.Run.Scratch) {
		t.Fatalf("after the run: %s there %v (want gone), %s there %v (want kept), the run's own gone %v",
			dead.Name, exists(dead.Name), live.Name, exists(live.Name), g.gone(t, h.Run.Scratch))
	}
	granted := false
	for _, gr := range h.Grants {
		granted = granted || gr.Token == tok
	}
	if h.Run.DurationNS >= h.Run.RequestedNS || !granted {
		t.Fatalf("the interrupted run ran %v of %v, with grants %+v; want the grant of token %d, whose write landed before the interrupt",
			time.Duration(h.Run.DurationNS), time.Duration(h.Run.RequestedNS), h.Grants, tok)
	}
}

// firstLandedWrite waits until a write has landed in the scratch table a
// verify run creates in schema (any table of verify's prefix but the
// skipped ones) and returns its token, or fence.None when ctx ends first.
func firstLandedWrite(ctx context.Context, db *sql.DB, schema string, skip ...string) fence.Token {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var tok int64
		rows, err := db.QueryContext(ctx, `SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname LIKE 'fencekit\_verify\_%' AND NOT c.relname = ANY($2)`, schema, skip)
		if err == nil {
			var names []string
			for rows.Next() {
				var n string
				if rows.Scan(&n) == nil {
					names = append(names, n)
				}
			}
			rows.Close()
			for _, n := range names {
				// The table may be dropped meanwhile (the run failed):
				// then the query fails, and the wait goes on until ctx ends.
				_ = db.QueryRowContext(ctx, "SELECT lock_version FROM "+pgx.Identifier{schema, n}.Sanitize()+" WHERE k = 'verify'").Scan(&tok)
				if tok > 0 {
					return fence.Token(tok)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fence.None
		case <-tick.C:
		}
	}
}

// TestVerifyKilledLeavesNoWorkerAndItsScratchIsSwept: the real command,
// killed with SIGKILL mid-run, leaves no worker running (each dies with
// it, even a stopped one), and the scratch table it leaves is removed by
// the sweep of a later run once its expiry is past.
func TestVerifyKilledLeavesNoWorkerAndItsScratchIsSwept(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	st, g := sharedRedis(t), pgGuard(t)
	schema := g.flags[3]
	out := t.TempDir()
	cmd := exec.Command(exe, append(append(append([]string{"verify"}, st.flags...), g.flags...), "--duration", "1m", "--ttl", "500ms", "--faults", "stop", "--fault-interval", "300ms", "--out", out)...)
	cmd.Env = append(os.Environ(), "FENCEKIT_TEST_RUN_MAIN=1", databaseURLVar+"="+testenv.PostgresURL(), redisURLVar+"="+testenv.RedisURL())
	var stderr testkit.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck
	// Its workers: the children of the command, once they run.
	var workers []int
	deadline := time.Now().Add(30 * time.Second)
	for len(workers) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no 3 workers after 30s; stderr:\n%s", stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
		workers = childrenOf(t, cmd.Process.Pid)
	}
	time.Sleep(time.Second)                    // a worker or two stopped by now
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, pid := range workers {
		gone := false
		for range 100 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) || zombie(pid) {
				gone = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !gone {
			t.Errorf("worker %d still runs after its run was killed", pid)
		}
	}

	// The scratch table it left, swept by a later run once its time is
	// past (a later run's sweep, with its clock moved past the expiry).
	db, err := sql.Open("pgx", testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var left []string
	rows, err := db.Query(`SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname LIKE 'fencekit\_verify\_%'`, schema)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		left = append(left, n)
	}
	rows.Close()
	if len(left) != 1 {
		t.Fatalf("a killed run left %v; want its one scratch table", left)
	}
	gf := guardFlags{kind: guardPostgres, url: testenv.PostgresURL(), schema: schema, getenv: func(string) string { return "" }}
	gs, err := gf.open(testkit.Context(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gs.close()
	if swept, err := gs.sweep(testkit.Context(t), time.Now()); err != nil || len(swept) != 0 {
		t.Fatalf("a sweep before the leftover's expiry removed %v (%v)", swept, err)
	}
	swept, err := gs.sweep(testkit.Context(t), time.Now().Add(time.Minute+scratchGrace+time.Minute))
	if err != nil || len(swept) != 1 || swept[0] != schema+"."+left[0] || !g.gone(t, scratch{Schema: schema, Name: left[0]}) {
		t.Fatalf("the sweep after the expiry removed %v (%v); want %s", swept, err, left[0])
	}
}

// childrenOf returns the pids of pid's children (Linux).
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatalf("this test reads /proc: %v", err)
	}
	var kids []int
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			var k int
			if _, err := fmt.Sscan(f, &k); err == nil {
				kids = append(kids, k)
			}
		}
	}
	return kids
}

// zombie reports whether pid has exited and waits for its parent to reap
// it.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}

// TestVerifyRunsHooks: the faults verify cannot inject itself come from
// the user's commands: --hook-partition is run at a partition and again
// at its heal (here it stalls a Redis server of the test's own with
// CLIENT PAUSE), --hook for the other events (a restart); each gets the
// event and the workers' pids, and the run records them as faults.
// Partitions and restarts take turns, so both run although a draw made
// while a hook is busy is skipped.
func TestVerifyRunsHooks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	_, port, _ := strings.Cut(srv.Addr, ":")
	st := redisStore(t, "redis://"+srv.Addr+"/0", "standalone", func(t *testing.T) redis.UniversalClient { return srv.Client() })
	log := filepath.Join(t.TempDir(), "hooks.log")
	partition := fmt.Sprintf(`echo "$FENCEKIT_VERIFY_EVENT pids=$FENCEKIT_VERIFY_WORKER_PIDS" >> %s; if [ "$FENCEKIT_VERIFY_EVENT" = partition ]; then redis-cli -p %s client pause 700 all; fi`, log, port)
	other := fmt.Sprintf(`echo "$FENCEKIT_VERIFY_EVENT run=$FENCEKIT_VERIFY_RUN" >> %s`, log)
	code, stdout, stderr, h, _ := runVerifyOn(t, testkit.Context(t), st, pgGuard(t), nil,
		"--duration", "3s", "--ttl", "500ms", "--faults", "none", "--fault-interval", "200ms", "--hook-partition", partition, "--hook", other)
	if code != exitOK || h == nil {
		t.Fatalf("verify with hooks = %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var partitions, heals, restarts int
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "partition pids="):
			partitions++
			if heals != partitions-1 {
				t.Errorf("a partition before the last one was healed: %q", lines)
			}
		case strings.HasPrefix(l, "heal pids="):
			heals++
		case l == "restart run="+h.Run.ID:
			restarts++
		default:
			t.Errorf("unexpected hook line %q", l)
		}
		if strings.Contains(l, "pids=") && len(strings.Fields(strings.TrimPrefix(l[strings.Index(l, "pids="):], "pids="))) < 3 {
			t.Errorf("the hook did not get the workers' pids: %q", l)
		}
	}
	if partitions == 0 || heals != partitions || restarts == 0 {
		t.Fatalf("hook events %q: want partitions, each healed, and restarts", lines)
	}
	if d := partitions - restarts; d != 0 && d != 1 {
		t.Fatalf("hook events %q: %d partitions and %d restarts; they should take turns, partition first", lines, partitions, restarts)
	}
	recorded := map[string]int{}
	for _, f := range h.Faults {
		recorded[f.Kind]++
		if f.End < f.Start {
			t.Errorf("fault %+v ends before it starts", f)
		}
	}
	if recorded[faultPartition] != partitions || recorded[faultRestart] != restarts || len(h.Faults) != partitions+restarts {
		t.Fatalf("faults recorded %v; the hooks ran %d partitions and %d restarts", recorded, partitions, restarts)
	}
}

// TestVerifyUsage: bad flags are refused before anything is touched.
func TestVerifyUsage(t *testing.T) {
	t.Parallel()
	env := map[string]string{redisURLVar: "redis://127.0.0.1:1/0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--store", "redis"}, "pass --guard"},
		{[]string{"--store", "redis", "--guard", "oracle"}, "unknown --guard"},
		{[]string{"--store", "redis", "--guard", "sqlite"}, "--guard sqlite needs --guard-url"},
		{[]string{"--store", "redis", "--guard", "s3", "--bucket", ""}, "--guard s3 needs --bucket"},
		{[]string{"--store", "mongo", "--guard", "postgres"}, "unknown --store"},
		{[]string{"--guard", "postgres", "--workers", "1"}, "--workers must be at least 2"},
		{[]string{"--guard", "postgres", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"--guard", "postgres", "--ttl", "-1s"}, "--ttl must be positive"},
		{[]string{"--guard", "postgres", "--faults", "stop,flood"}, `unknown fault "flood"`},
		{[]string{"--guard", "postgres", "--faults", "partition"}, "--faults partition needs --hook-partition or --hook"},
		{[]string{"--guard", "postgres", "--faults", "restart", "--hook-partition", "true"}, "--faults restart needs --hook-restart or --hook"},
		{[]string{"--guard", "postgres", "--fault-interval", "-1s"}, "--fault-interval must not be negative"},
		{[]string{"--guard", "postgres", "--hook-timeout", "0s"}, "--hook-timeout must be positive"},
		{[]string{"--guard", "postgres", "--nope"}, "flag provided but not defined"},
	} {
		code, _, stderr := leaseStore{env: env}.cli(t, testkit.Context(t), nil, append([]string{"verify"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("verify %q = %d, %q; want usage error %q", tc.args, code, stderr, tc.want)
		}
	}
	if code, out, _ := (leaseStore{}).cli(t, testkit.Context(t), nil, "verify", "help"); code != exitOK || !strings.Contains(out, "--recheck FILE") {
		t.Errorf("verify help = %d, %q", code, out)
	}
	// A lease store that does not answer is named before anything is made.
	code, _, stderr := leaseStore{env: env}.cli(t, testkit.Context(t), nil, "verify", "--store", "redis", "--guard", "postgres", "--timeout", "2s")
	if code != exitFail || !strings.Contains(stderr, "fencekit verify: the lease store: ") {
		t.Errorf("verify against nothing = %d, %q; want a failure naming the store", code, stderr)
	}
	// The worker command is not for people.
	var out testkit.SyncBuffer
	if code := runWorker(context.Background(), strings.NewReader("hello\n"), &out, &out); code != exitUsage || !strings.Contains(out.String(), "not for direct use") {
		t.Errorf("verify-worker by hand = %d, %q", code, out.String())
	}
}
