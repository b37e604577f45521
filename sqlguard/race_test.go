package sqlguard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestRaceWriters runs several writers with interleaved tokens against the
// same row (row-level fencing) and the same resource (a fenced
// transaction), each over its own connections, for many rounds. Every
// accepted write appends its token to a history table in the same
// transaction, while it holds the row's (or resource's) lock, so the
// history's order is the commit order. The history must never go down,
// must hold exactly the accepted writes, and the final version must be the
// greatest token presented.
func TestRaceWriters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const (
		writers = 4
		rounds  = 150
	)
	e.exec(t, `CREATE TABLE acc (id int PRIMARY KEY, balance bigint NOT NULL, lock_version bigint NOT NULL DEFAULT 0)`)
	e.exec(t, `INSERT INTO acc VALUES (1, 0, 0), (2, 0, 0)`)
	e.exec(t, `CREATE TABLE row_history (seq bigserial PRIMARY KEY, token bigint NOT NULL)`)
	e.exec(t, `CREATE TABLE res_history (seq bigserial PRIMARY KEY, token bigint NOT NULL)`)
	tbl, err := sqlguard.NewTable("", "acc", "id")
	if err != nil {
		t.Fatal(err)
	}
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}

	// rowWrite is a fenced row update plus its history entry, in one tx.
	rowWrite := func(tok fence.Token) (bool, error) {
		accepted := false
		err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
			err := tbl.Update(ctx, tx, []any{1}, tok, sqlguard.Col("balance", int64(tok)))
			if err != nil {
				return err
			}
			accepted = true
			_, err = tx.Exec(ctx, `INSERT INTO row_history (token) VALUES ($1)`, int64(tok))
			return err
		})
		return accepted && err == nil, err
	}
	// resWrite is a fenced transaction with a plain UPDATE (of row 2, whose
	// only writers are these transactions) and its history entry.
	resWrite := func(tok fence.Token) (bool, error) {
		err := g.BeginFunc(ctx, e.Pool, "race", tok, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE acc SET balance = $1 WHERE id = 2`, int64(tok)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO res_history (token) VALUES ($1)`, int64(tok))
			return err
		})
		return err == nil, err
	}

	type result struct {
		accepted   map[string][]int64
		staleCount map[string]int
		errs       []error
	}
	results := make([]result, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := result{accepted: map[string][]int64{}, staleCount: map[string]int{}}
			defer func() { results[w] = r }()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for round := range rounds {
				tok := fence.Token(round*writers + w + 1)
				for kind, write := range map[string]func(fence.Token) (bool, error){"row": rowWrite, "resource": resWrite} {
					if rng.IntN(2) == 0 {
						time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
					}
					for attempt := 0; ; attempt++ {
						ok, err := write(tok)
						if sqlguard.IsRetryable(err) && attempt < 10 {
							continue
						}
						switch se, isStale := fence.AsStale(err); {
						case ok:
							r.accepted[kind] = append(r.accepted[kind], int64(tok))
						case isStale:
							r.staleCount[kind]++
							if se.Current <= se.Presented || se.Presented != tok {
								r.errs = append(r.errs, fmt.Errorf("%s: bad stale error %+v", kind, *se))
							}
						default:
							r.errs = append(r.errs, fmt.Errorf("%s token %d: %w", kind, tok, err))
						}
						break
					}
				}
			}
		}()
	}
	wg.Wait()

	maxTok := int64(rounds * writers)
	for _, kind := range []string{"row", "resource"} {
		var accepted []int64
		stales := 0
		for _, r := range results {
			for _, err := range r.errs {
				t.Error(err)
			}
			accepted = append(accepted, r.accepted[kind]...)
			stales += r.staleCount[kind]
		}
		if len(accepted)+stales != rounds*writers {
			t.Errorf("%s: %d accepted + %d stale != %d writes", kind, len(accepted), stales, rounds*writers)
		}
		histTable := map[string]string{"row": "row_history", "resource": "res_history"}[kind]
		rows, err := e.Pool.Query(ctx, `SELECT token FROM `+histTable+` ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		history, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(history); i++ {
			if history[i] < history[i-1] {
				t.Errorf("%s: token %d committed after %d", kind, history[i], history[i-1])
			}
		}
		sorted := append([]int64(nil), history...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		sort.Slice(accepted, func(i, j int) bool { return accepted[i] < accepted[j] })
		if !equal(sorted, accepted) {
			t.Errorf("%s: history %v != accepted writes %v", kind, sorted, accepted)
		}
		if len(history) == 0 || history[len(history)-1] != maxTok {
			t.Errorf("%s: last committed token is not the greatest presented (%d)", kind, maxTok)
		}
		t.Logf("%s: %d accepted, %d stale", kind, len(accepted), stales)
	}
	if lv, bal := e.int64Query(t, `SELECT lock_version FROM acc WHERE id = 1`), e.int64Query(t, `SELECT balance FROM acc WHERE id = 1`); lv != maxTok || bal != maxTok {
		t.Errorf("row 1: lock_version %d, balance %d, want both %d", lv, bal, maxTok)
	}
	if got := e.storedToken(t, "race"); got != maxTok {
		t.Errorf("resource token %d, want %d", got, maxTok)
	}
	if got := e.int64Query(t, `SELECT balance FROM acc WHERE id = 2`); got != maxTok {
		t.Errorf("row 2 balance %d, want %d", got, maxTok)
	}
}
