package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/riverfence"
)

// summary is what the run found, and what --json writes.
type summary struct {
	OK       bool          `json:"ok"`
	Verdict  []string      `json:"verdict"`
	Unfenced bool          `json:"unfenced"`
	Schema   string        `json:"schema"`
	JobID    int64         `json:"job_id"`
	TokenA   fence.Token   `json:"token_a"`
	TokenB   fence.Token   `json:"token_b"`
	Final    finalState    `json:"final"`
	Events   []event       `json:"events"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// finalState is what the stores kept.
type finalState struct {
	JobState      string       `json:"job_state"`
	JobAttempt    int          `json:"job_attempt"`
	ReportedToken *int64       `json:"reported_token"` // the token of the attempt whose outcome River recorded
	Payment       string       `json:"payment"`
	Balance       int          `json:"balance"`
	Ledger        []ledgerLine `json:"ledger"`
}

type ledgerLine struct {
	Worker  string      `json:"worker"`
	Attempt int         `json:"attempt"`
	Token   fence.Token `json:"token"`
}

// conclude reads the stores and judges the run.
func (sc *scenario) conclude(ctx context.Context, sum *summary) error {
	s := pgx.Identifier{sc.cfg.Schema}.Sanitize()
	f := &sum.Final
	err := sc.Pool.QueryRow(ctx, `SELECT j.state::text, j.attempt, (j.metadata -> '`+riverfence.MetadataKey+`' ->> 'token')::bigint,
		p.status, (SELECT balance FROM `+s+`.accounts WHERE id = 1)
		FROM `+s+`.river_job j, `+s+`.payments p WHERE j.id = $1 AND p.job_id = j.id`, sc.jobID).
		Scan(&f.JobState, &f.JobAttempt, &f.ReportedToken, &f.Payment, &f.Balance)
	if err != nil {
		return fmt.Errorf("reading the job back: %w", err)
	}
	rows, err := sc.Pool.Query(ctx, `SELECT worker, attempt, token FROM `+s+`.ledger WHERE job_id = $1 ORDER BY at`, sc.jobID)
	if err != nil {
		return err
	}
	f.Ledger, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledgerLine, error) {
		var l ledgerLine
		var tok int64
		err := r.Scan(&l.Worker, &l.Attempt, &tok)
		l.Token = fence.Token(tok)
		return l, err
	})
	if err != nil {
		return err
	}
	sum.judge()
	return nil
}

// judge derives the verdict from the stores' state and A's events.
func (sum *summary) judge() {
	f := sum.Final
	var problems, facts []string
	switch n := len(f.Ledger); {
	case n == 1 && f.Balance == amount:
		facts = append(facts, fmt.Sprintf("The amount was paid once, by worker %s (attempt %d).", f.Ledger[0].Worker, f.Ledger[0].Attempt))
	default:
		workers := make([]string, len(f.Ledger))
		for i, l := range f.Ledger {
			workers[i] = fmt.Sprintf("%s (attempt %d)", l.Worker, l.Attempt)
		}
		problems = append(problems, fmt.Sprintf("The amount was paid %d times (balance %d, want %d): by %s.", n, f.Balance, amount, strings.Join(workers, ", ")))
	}
	if f.JobState != "completed" || f.JobAttempt != 2 {
		problems = append(problems, fmt.Sprintf("The job is %s at attempt %d, not completed by attempt 2.", f.JobState, f.JobAttempt))
	} else if !sum.Unfenced && (f.ReportedToken == nil || fence.Token(*f.ReportedToken) != sum.TokenB) {
		problems = append(problems, "River recorded another attempt's outcome than the second's on the job.")
	} else {
		facts = append(facts, "The job is completed by attempt 2, and River recorded attempt 2's outcome.")
	}
	if f.Payment != "paid by B" {
		problems = append(problems, fmt.Sprintf("The payment row says %q: the first attempt's late write is the one that stayed.", f.Payment))
	}
	for _, e := range sum.Events {
		if e.Role == "A" && (e.Kind == evWrite || e.Kind == evComplete) {
			switch {
			case e.Stale:
				facts = append(facts, fmt.Sprintf("A's late %s was refused as stale: token %d, the store had %d.", kindName(e.Kind), sum.TokenA, e.Current))
			case e.Accepted:
				problems = append(problems, fmt.Sprintf("A's late %s was accepted after River had given the job to B.", kindName(e.Kind)))
			}
		}
		if e.Role == "A" && e.Kind == evContext && e.Superseded {
			facts = append(facts, "A's context ended: the middleware saw that River had run the job again.")
		}
	}
	sum.OK = len(problems) == 0
	if sum.OK {
		sum.Verdict = append([]string{"OK: the first attempt, frozen past River's rescue, could neither write nor complete the job."}, facts...)
		return
	}
	head := "FAILED: the job's effects did not happen once."
	if sum.Unfenced {
		head = "UNSAFE, as expected without fencing: River's rescue ran the job twice, and both attempts paid."
	}
	sum.Verdict = append(append([]string{head}, problems...), facts...)
}

func kindName(kind string) string {
	if kind == evWrite {
		return "progress write"
	}
	return "payment and completion"
}

func (sum *summary) print(out io.Writer) {
	f := sum.Final
	fmt.Fprintf(out, "\nFinal state:\n  job %d: %s, attempt %d\n  payment row: %s\n  account balance: %d (the job pays %d)\n  ledger:\n",
		sum.JobID, f.JobState, f.JobAttempt, f.Payment, f.Balance, amount)
	for _, l := range f.Ledger {
		fmt.Fprintf(out, "    paid by %s, attempt %d, token %d\n", l.Worker, l.Attempt, l.Token)
	}
	fmt.Fprintf(out, "\nVerdict (%.1fs):\n", sum.Elapsed.Seconds())
	for _, l := range sum.Verdict {
		fmt.Fprintln(out, "  "+l)
	}
}
