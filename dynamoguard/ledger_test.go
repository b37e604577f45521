package dynamoguard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// newLedgerTable creates a ledger table with LedgerTableInput, dropped
// when the test ends.
func newLedgerTable(t *testing.T) string {
	t.Helper()
	c := dynamotest.Client(t)
	table := dynamotest.TableName(t, "ledger")
	ctx := testkit.Context(t)
	if _, err := c.CreateTable(ctx, dynamoguard.LedgerTableInput(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamotest.Delete(ctx, c, table); err != nil {
			t.Error(err)
		}
	})
	if err := dynamodb.NewTableExistsWaiter(c).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	return table
}

// ledgerIn is a ledger with a table of the job's own effects.
type ledgerIn struct {
	*dynamoguard.Ledger
	effects string
}

// The ledger passes the ledger suite on DynamoDB Local; the done mark is
// written in one transaction with the job's own items.
func TestLedgerConformance(t *testing.T) {
	t.Parallel()
	guardtest.RunLedger(t, guardtest.LedgerConfig{
		NewLedger: func(t *testing.T) guardtest.Ledger {
			lg, err := dynamoguard.NewLedger(dynamotest.Client(t), newLedgerTable(t))
			if err != nil {
				t.Fatal(err)
			}
			return ledgerIn{lg, newTable(t)}
		},
		MarkDoneWithJob: func(t *testing.T, ctx context.Context, l guardtest.Ledger, job, run string, token fence.Token, fail bool) error {
			in := l.(ledgerIn)
			items := []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(in.effects), Item: item("effect/"+run, "done")}}}
			if fail {
				// A condition of the job's own that does not hold.
				items = append(items, types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
					TableName: aws.String(in.effects), Key: key("absent"), ConditionExpression: aws.String("attribute_exists(pk)"),
				}})
			}
			err := in.MarkDoneTransact(ctx, job, run, token, items)
			if got := rawItem(t, in.effects, "effect/"+run); (got != nil) != (err == nil) {
				t.Fatalf("MarkDoneTransact = %v, and the job's own item is %v: not all or nothing", err, got)
			}
			return err
		},
	})
}

// RunOnce over a DynamoDB ledger runs each job once per run key, two jobs
// that share the ledger and the key included.
func TestRunOnceWithTheLedger(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t)
	lg, err := dynamoguard.NewLedger(dynamotest.Client(t), newLedgerTable(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.Check(ctx); err != nil {
		t.Fatalf("Check = %v", err)
	}
	m := testkit.NewManager(t, memlease.New(), 10*time.Second)
	runs := map[string]int{}
	for range 3 {
		for _, name := range []string{"settle orders", "reports"} {
			if _, err := m.RunOnce(ctx, name, "2026-12-01", lg, func(context.Context, *lease.Lease) error { runs[name]++; return nil }); err != nil {
				t.Fatalf("RunOnce(%q) = %v", name, err)
			}
		}
	}
	if runs["settle orders"] != 1 || runs["reports"] != 1 {
		t.Fatalf("runs = %v; want each job once", runs)
	}
	// A done mark with the job's items, for a run never claimed.
	if err := lg.MarkDoneTransact(ctx, "reports", "never claimed", 5, nil); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("MarkDoneTransact of a run never claimed = %v; want fence.ErrNotFound", err)
	}
}

// A table not keyed by job and run_key, and a missing one, are refused
// by Check and at the first claim, naming the fix, before anything is
// written.
func TestLedgerRefusesAnUnfitTable(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t)
	c := dynamotest.Client(t)
	plain := newTable(t) // keyed by pk alone
	lg, err := dynamoguard.NewLedger(c, plain)
	if err != nil {
		t.Fatal(err)
	}
	guardtest.WantSetup(t, "Check of a table keyed by pk", lg.Check(ctx), []error{fence.ErrLedgerTable}, "pk (S)", "LedgerTableInput")
	_, err = lg.Claim(ctx, "nightly", "night-1", 5)
	guardtest.WantSetup(t, "Claim in a table keyed by pk", err, []error{fence.ErrLedgerTable}, "LedgerTableInput")
	if it := rawGet(t, c, plain, key("nightly")); it != nil {
		t.Fatalf("a refused claim wrote %v", it)
	}
	missing, err := dynamoguard.NewLedger(c, dynamotest.TableName(t, "absent"))
	if err != nil {
		t.Fatal(err)
	}
	err = missing.MarkDone(ctx, "nightly", "night-1", 5)
	guardtest.WantSetup(t, "MarkDone in a missing table", err, []error{fence.ErrLedgerTable, fence.ErrNoTable}, "LedgerTableInput")
	if !errors.Is(missing.Check(ctx), fence.ErrLedgerTable) {
		t.Fatalf("Check of a missing table: %v", missing.Check(ctx))
	}
}
