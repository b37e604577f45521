package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// settleOrdersSummary is the part of the settle-orders program's --json
// summary this test reads.
type settleOrdersSummary struct {
	OK             bool        `json:"ok"`
	Verdict        string      `json:"verdict"`
	Job            string      `json:"job"`
	Period         string      `json:"period"`
	Orders         int         `json:"orders"`
	Replicas       int         `json:"replicas"`
	Database       string      `json:"database"`
	LeaseKeys      []string    `json:"lease_keys"`
	Frozen         string      `json:"frozen"`
	FrozenToken    fence.Token `json:"frozen_token"`
	CompletedBy    string      `json:"completed_by"`
	CompletedToken fence.Token `json:"completed_token"`
	LateWrites     []struct {
		Replica string      `json:"replica"`
		Store   string      `json:"store"`
		Token   fence.Token `json:"token"`
		Outcome string      `json:"outcome"`
		Current fence.Token `json:"current"`
	} `json:"late_writes"`
	Metrics []struct {
		Kind     string `json:"kind"`
		Replicas map[string]struct {
			Answered   bool               `json:"answered"`
			JobRunning float64            `json:"job_running"`
			Lost       float64            `json:"lost"`
			Writes     map[string]float64 `json:"writes"`
		} `json:"replicas"`
	} `json:"metrics"`
	Checks []struct {
		OK   bool   `json:"ok"`
		Text string `json:"text"`
	} `json:"checks"`
}

// TestSettleOrders runs the settle-orders program (examples/settleorders)
// as the program it is, against the machine's Redis and MariaDB: replicas
// of the nightly job, the holder frozen with SIGSTOP past its lease's TTL
// and resumed once another replica finished the night. It asserts the
// program's own verdict and checks, then reads the run's database itself
// (--keep leaves it): every order settled and paid once, by the frozen
// holder before its freeze or by the replica that completed the night,
// each row's lock_version its writer's token; the resource's token and the
// night's record the completing replica's; the ledger's run done. Every
// late write in the summary was refused as stale naming that token, and
// the frozen replica's metrics counted its loss.
func TestSettleOrders(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"three replicas", []string{"--ttl", "1s", "--orders", "12", "--order-time", "50ms"}},
		{"four replicas, short TTL", []string{"--ttl", "500ms", "--replicas", "4", "--orders", "30", "--freeze-after", "10", "--order-time", "10ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := filepath.Join(t.TempDir(), "summary.json")
			out, err := exec.Command(exampleBinary(t, "settleorders"), append(tc.args, "--keep", "--json", js)...).CombinedOutput()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatalf("running the program: %v\n%s", err, out)
			}
			b, rerr := os.ReadFile(js)
			if rerr != nil {
				t.Fatalf("the program exited (%v) without a summary: %v\n%s", err, rerr, out)
			}
			var sum settleOrdersSummary
			if err := json.Unmarshal(b, &sum); err != nil {
				t.Fatalf("summary: %v", err)
			}
			t.Cleanup(func() { removeSettleOrdersRun(t, sum) })
			if err != nil || !sum.OK {
				t.Errorf("exit %v, ok %v; want exit 0 and ok: %s", err, sum.OK, sum.Verdict)
			}
			for _, c := range sum.Checks {
				if !c.OK {
					t.Errorf("the program's check failed: %s", c.Text)
				}
			}
			checkSettleOrdersSummary(t, sum)
			checkSettleOrdersDatabase(t, sum)
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// checkSettleOrdersSummary checks the late writes and the metrics the
// summary reports.
func checkSettleOrdersSummary(t *testing.T, sum settleOrdersSummary) {
	t.Helper()
	if sum.Frozen == "" || sum.CompletedBy == "" || sum.Frozen == sum.CompletedBy || sum.CompletedToken <= sum.FrozenToken {
		t.Fatalf("frozen %s (token %d), completed by %s (token %d): want two replicas, the later token greater",
			sum.Frozen, sum.FrozenToken, sum.CompletedBy, sum.CompletedToken)
	}
	late := map[string]int{}
	for _, w := range sum.LateWrites {
		late[w.Store]++
		if w.Replica != sum.Frozen || w.Token != sum.FrozenToken || w.Outcome != "stale" || w.Current != sum.CompletedToken {
			t.Errorf("late write %+v: want %s's token %d refused as stale, naming %d", w, sum.Frozen, sum.FrozenToken, sum.CompletedToken)
		}
	}
	if late["mariadb"] == 0 || late["inventory"] == 0 {
		t.Errorf("late writes by store %v: want some to MariaDB and some to the inventory service", late)
	}
	// A reading scrapes the replicas side by side, not at one instant. The
	// job gauges are summed only over readings during which the lease
	// cannot change hands: a holder stopped at an order with the others
	// waiting (before-freeze, frozen) and the night over (final). After
	// the resume, the replicas that had waited take the lease one after
	// another to find the ledger's run done, and two of them can each be
	// read while holding it, a few milliseconds apart (leaseprom's docs
	// say a hand-off can show 2 for one scrape).
	exclusive := map[string]bool{"before-freeze": true, "frozen": true, "final": true}
	kinds := map[string]bool{}
	for _, s := range sum.Metrics {
		kinds[s.Kind] = true
		var running float64
		for _, m := range s.Replicas {
			running += m.JobRunning
		}
		if exclusive[s.Kind] && running > 1 {
			t.Errorf("metrics %s: the job gauge summed %v over the replicas that answered, want at most 1", s.Kind, running)
		}
		if s.Kind == "final" {
			m := s.Replicas[sum.Frozen]
			if !m.Answered || m.Lost < 1 || m.Writes["dbguard stale"] != float64(late["mariadb"]) || m.Writes["fencehttp stale"] != float64(late["inventory"]) {
				t.Errorf("the frozen replica's final metrics %+v: want its loss and its %d and %d refused writes counted", m, late["mariadb"], late["inventory"])
			}
		}
	}
	for _, k := range []string{"before-freeze", "frozen", "after-resume", "final"} {
		if !kinds[k] {
			t.Errorf("no metrics reading %q", k)
		}
	}
}

// checkSettleOrdersDatabase reads the run's database with the test's own
// connection.
func checkSettleOrdersDatabase(t *testing.T, sum settleOrdersSummary) {
	t.Helper()
	db := settleOrdersDB(t, sum.Database)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tokens := map[string]fence.Token{sum.Frozen: sum.FrozenToken, sum.CompletedBy: sum.CompletedToken}
	rows, err := db.QueryContext(ctx, `SELECT o.id, o.status, COALESCE(o.settled_by, ''), COALESCE(o.settled_token, 0), o.lock_version,
		(SELECT COUNT(*) FROM payouts p WHERE p.order_id = o.id AND p.amount_cents = o.amount_cents AND p.token = o.settled_token)
		FROM orders o ORDER BY o.id`)
	if err != nil {
		t.Fatalf("reading the orders: %v", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			id, payouts      int
			status, by       string
			settled, version uint64
		)
		if err := rows.Scan(&id, &status, &by, &settled, &version, &payouts); err != nil {
			t.Fatal(err)
		}
		n++
		if tok, ok := tokens[by]; status != "settled" || !ok || fence.Token(settled) != tok || version != settled || payouts != 1 {
			t.Errorf("order %d: %s by %q with token %d, lock_version %d, %d matching payouts; want settled by %s or %s with its token, paid once",
				id, status, by, settled, version, payouts, sum.Frozen, sum.CompletedBy)
		}
	}
	if err := rows.Err(); err != nil || n != sum.Orders {
		t.Fatalf("%d orders read (%v), want %d", n, err, sum.Orders)
	}
	var all int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM payouts`).Scan(&all); err != nil || all != sum.Orders {
		t.Errorf("%d payouts (%v), want %d", all, err, sum.Orders)
	}
	var resourceToken uint64
	if err := db.QueryRowContext(ctx, `SELECT token FROM fencekit_resource_tokens WHERE resource = ?`, "orders/"+sum.Job).Scan(&resourceToken); err != nil ||
		fence.Token(resourceToken) != sum.CompletedToken {
		t.Errorf("resource orders/%s at token %d (%v), want the completing replica's %d", sum.Job, resourceToken, err, sum.CompletedToken)
	}
	var runs int
	var runToken uint64
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), MAX(token) FROM settlement_runs WHERE period = ?`, sum.Period).Scan(&runs, &runToken); err != nil ||
		runs != 1 || fence.Token(runToken) != sum.CompletedToken {
		t.Errorf("%d run records for %s, token %d (%v); want one, by token %d", runs, sum.Period, runToken, err, sum.CompletedToken)
	}
	var done bool
	if err := db.QueryRowContext(ctx, `SELECT done_at IS NOT NULL FROM fencekit_job_runs WHERE job = ? AND run_key = ?`, sum.Job, sum.Period).Scan(&done); err != nil || !done {
		t.Errorf("the ledger's run %s/%s done: %v (%v), want done", sum.Job, sum.Period, done, err)
	}
}

// settleOrdersDB opens the run's database on the MariaDB the tests use.
func settleOrdersDB(t *testing.T, name string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// settleOrdersDatabase is how the program names its databases.
var settleOrdersDatabase = regexp.MustCompile(`^settleorders_[0-9a-f]{8}$`)

// removeSettleOrdersRun removes what the run kept (--keep): its database
// and the lease's Redis keys.
func removeSettleOrdersRun(t *testing.T, sum settleOrdersSummary) {
	if settleOrdersDatabase.MatchString(sum.Database) {
		db := settleOrdersDB(t, "")
		defer db.Close()
		if _, err := db.Exec("DROP DATABASE IF EXISTS " + sum.Database); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	}
	if len(sum.LeaseKeys) > 0 {
		opt, err := redis.ParseURL(testenv.RedisURL())
		if err != nil {
			t.Errorf("cleaning up: %v", err)
			return
		}
		rc := redis.NewClient(opt)
		defer rc.Close()
		if err := rc.Del(context.Background(), sum.LeaseKeys...).Err(); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	}
}
