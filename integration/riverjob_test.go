package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// riverjobSummary is what examples/riverjob writes with --json (the
// fields this test reads).
type riverjobSummary struct {
	OK      bool     `json:"ok"`
	Verdict []string `json:"verdict"`
	Schema  string   `json:"schema"`
	JobID   int64    `json:"job_id"`
	TokenA  uint64   `json:"token_a"`
	TokenB  uint64   `json:"token_b"`
}

// TestRiverJob runs the River demo as a user does, fenced and unfenced,
// and reads what it kept (--keep) from PostgreSQL itself: fenced, the job
// paid once, by its second attempt, which also completed it; unfenced,
// twice, and the demo says so with exit status 1.
func TestRiverJob(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		exit     int
		payments int
	}{
		{"fenced", nil, 0, 1},
		{"unfenced", []string{"--unfenced"}, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sum riverjobSummary
			out, code := runExample(t, "riverjob", append(tc.args, "--keep"), &sum)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := pgx.Connect(ctx, testenv.PostgresURL())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			schema := pgx.Identifier{sum.Schema}.Sanitize()
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				c, err := pgx.Connect(ctx, testenv.PostgresURL())
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close(ctx)
				if _, err := c.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
					t.Errorf("drop the kept schema: %v", err)
				}
			})
			if code != tc.exit || sum.OK != (tc.exit == 0) {
				t.Errorf("exit %d, ok %v; want exit %d: %v\n%s", code, sum.OK, tc.exit, sum.Verdict, out)
			}
			var (
				payments, attempt int
				state, byLast     string
				lastToken         int64
			)
			if err := conn.QueryRow(ctx, `SELECT count(*), (SELECT state::text FROM `+schema+`.river_job WHERE id = $1),
				(SELECT attempt FROM `+schema+`.river_job WHERE id = $1),
				coalesce((SELECT worker FROM `+schema+`.ledger ORDER BY at LIMIT 1), ''),
				coalesce((SELECT token FROM `+schema+`.ledger ORDER BY at LIMIT 1), 0)
				FROM `+schema+`.ledger WHERE job_id = $1`, sum.JobID).Scan(&payments, &state, &attempt, &byLast, &lastToken); err != nil {
				t.Fatal(err)
			}
			if payments != tc.payments || state != "completed" || attempt != 2 {
				t.Errorf("the job paid %d times and is %s at attempt %d; want %d payments, completed at attempt 2", payments, state, attempt, tc.payments)
			}
			if tc.exit == 0 && (byLast != "B" || uint64(lastToken) != sum.TokenB || sum.TokenB <= sum.TokenA) {
				t.Errorf("the payment is %s's with token %d; want B's with its token %d, above A's %d", byLast, lastToken, sum.TokenB, sum.TokenA)
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}
