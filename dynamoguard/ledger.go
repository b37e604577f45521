package dynamoguard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/probeonce"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// The attributes of a ledger table's items: the job and the run's key
// (the table's partition and sort key, both strings), and when the run
// was marked done (an RFC 3339 string, absent until then). The guard's
// own attributes (lock_version, lock_nonce) fence each run.
const (
	LedgerJobAttribute  = "job"
	LedgerKeyAttribute  = "run_key"
	LedgerDoneAttribute = "done_at"
)

// LedgerTableInput returns the CreateTable input of a ledger table named
// table: partition key job (S), sort key run_key (S), billed per request.
// Pass it to your client's CreateTable (the Guard's Client does not
// create tables).
func LedgerTableInput(table string) *dynamodb.CreateTableInput {
	return &dynamodb.CreateTableInput{
		TableName: aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(LedgerJobAttribute), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(LedgerKeyAttribute), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(LedgerJobAttribute), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(LedgerKeyAttribute), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	}
}

// Ledger records the runs of once-per-period jobs
// (lease.Manager.RunOnce) in a DynamoDB table, through fenced writes: it
// is a lease.Ledger. Each run is one item, keyed by its job (the lease
// name RunOnce runs under, or lease.ForJob's name) and its run key, with
// a token of its own, so that two jobs that share the table and a key
// each run once, and tokens of two lease names are never compared. The
// table must be keyed by exactly job (partition key, S) and run_key (sort
// key, S): LedgerTableInput makes one. A Ledger refuses a table of
// another shape at its first use, before anything is written, with a
// *fence.SetupError matching fence.ErrLedgerTable that names the fix.
//
// Keep it in the tables the job writes to, so that the job's last
// writes can record the run done with MarkDoneTransact: then the job's
// effect and its record commit together or not at all.
//
// A Ledger is safe for concurrent use.
type Ledger struct {
	g     *Guard
	shape probeonce.Gate
}

// NewLedger returns a Ledger over table through client; opts are the
// Guard's (WithAttributes names the fencing attributes). It does no I/O.
// It returns the errors of New.
func NewLedger(client Client, table string, opts ...Option) (*Ledger, error) {
	g, err := New(client, table, opts...)
	if err != nil {
		return nil, err
	}
	return &Ledger{g: g}, nil
}

// Check is the ledger's start-up check: the Guard's Check of its table
// (the table exists, the server honours conditions), and that the table
// is keyed by exactly job and run_key. It returns nil, or a
// *fence.SetupError naming the fix (matching fence.ErrLedgerTable for a
// table of another shape or a missing one), or the server's error. ctx
// bounds the check.
func (lg *Ledger) Check(ctx context.Context) error {
	if err := lg.g.Check(ctx); err != nil {
		return lg.tableErr(err)
	}
	_, err := lg.checkShape(ctx)
	return err
}

// checkShape is the gate's probe: the table, checked, keyed as a ledger's.
func (lg *Ledger) checkShape(ctx context.Context) (bool, error) {
	if err := lg.g.ensureProbed(ctx); err != nil {
		return false, lg.tableErr(err)
	}
	s := lg.g.keySchema()
	if s.partition != (keyAttr{LedgerJobAttribute, types.ScalarAttributeTypeS}) || s.sort != (keyAttr{LedgerKeyAttribute, types.ScalarAttributeTypeS}) {
		return false, fence.Setup("create a table with dynamoguard.LedgerTableInput (partition key job, sort key run_key, both strings) and pass its name to NewLedger",
			"dynamoguard: ledger %s: %w: it is keyed by %s, not by exactly %s (S) and %s (S): a job's run could collide with another job's",
			lg.g.table, fence.ErrLedgerTable, s, LedgerJobAttribute, LedgerKeyAttribute)
	}
	return true, nil
}

// tableErr adds fence.ErrLedgerTable, and the way to make one, to a
// missing table's error.
func (lg *Ledger) tableErr(err error) error {
	if !errors.Is(err, fence.ErrNoTable) {
		return err
	}
	return &fence.SetupError{Err: fmt.Errorf("dynamoguard: ledger: %w: %w", fence.ErrLedgerTable, err),
		Fix: "create the table with dynamoguard.LedgerTableInput, or pass the right name to NewLedger"}
}

// run checks a call's arguments (before any I/O: fence.ErrInvalidArgument
// for an empty job or run key, fence.ErrInvalidToken for a bad token)
// and the table's shape (at the first use), and returns the run's key.
func (lg *Ledger) run(ctx context.Context, op, job, key string, token fence.Token) (map[string]types.AttributeValue, error) {
	if lg == nil {
		return nil, fmt.Errorf("dynamoguard: ledger: %s %q of job %q: %w: nil *Ledger (from a failed NewLedger?)", op, key, job, fence.ErrInvalidArgument)
	}
	if err := rowguard.CheckRun(validateToken(token), job, key); err != nil {
		return nil, fmt.Errorf("dynamoguard: ledger %s: %s %q of job %q: %w", lg.g.table, op, key, job, err)
	}
	if err := lg.shape.Ensure(ctx, lg.checkShape); err != nil {
		return nil, err
	}
	return map[string]types.AttributeValue{
		LedgerJobAttribute: &types.AttributeValueMemberS{Value: job},
		LedgerKeyAttribute: &types.AttributeValueMemberS{Value: key},
	}, nil
}

// Claim implements lease.Ledger: one conditional UpdateItem that records
// token as the newest holder of job's run key (creating the run's item)
// unless a newer token has claimed it, and returns the item as it was, so
// that whether the run is done comes with the claim. It returns a
// *fence.StaleError when a newer token has claimed the run (nothing
// changed); fence.ErrOutcomeUnknown when the answer was lost (claim
// again); a *fence.SetupError for a table that is missing or not a
// ledger's; before any I/O, fence.ErrInvalidArgument for an empty job or
// key and fence.ErrInvalidToken for a bad token. ctx bounds the call (and
// the table's check at the first use).
func (lg *Ledger) Claim(ctx context.Context, job, key string, token fence.Token) (bool, error) {
	k, err := lg.run(ctx, "claim", job, key, token)
	if err != nil {
		return false, err
	}
	before, known, err := lg.g.update(ctx, k, token, expression.UpdateBuilder{}, false)
	if err != nil {
		return false, err
	}
	if !known {
		// An earlier try of this claim landed: read the run.
		out, err := lg.g.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(lg.g.table), Key: k, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return false, lg.g.mapError(fmt.Errorf("dynamoguard: ledger: read %s: %w", lg.g.resource(k), err))
		}
		before = out.Item
	}
	_, done := before[LedgerDoneAttribute]
	return done, nil
}

// MarkDone implements lease.Ledger: one conditional UpdateItem that sets
// done_at on job's run key if token is not older than its newest claim.
// It returns nil when the run is recorded done by token (again, if it
// already was); a *fence.StaleError when a newer token has claimed the
// run; fence.ErrNotFound when it was never claimed; the other errors of
// Claim.
func (lg *Ledger) MarkDone(ctx context.Context, job, key string, token fence.Token) error {
	k, err := lg.run(ctx, "mark done", job, key, token)
	if err != nil {
		return err
	}
	_, _, err = lg.g.update(ctx, k, token, expression.Set(expression.Name(LedgerDoneAttribute), expression.Value(doneNow())), true)
	return err
}

// MarkDoneTransact records job's run key done by token together with
// items, the job's own writes (up to 99 TransactWriteItem actions, on any
// tables but not on the run's item), in one TransactWriteItems: either
// all of them are applied or none, so that the job's effect and its
// record commit together. The done mark is fenced as MarkDone's. Its
// errors are Guard.Transact's, and fence.ErrNotFound when the run was
// never claimed.
func (lg *Ledger) MarkDoneTransact(ctx context.Context, job, key string, token fence.Token, items []types.TransactWriteItem) error {
	k, err := lg.run(ctx, "mark done", job, key, token)
	if err != nil {
		return err
	}
	done := map[string]types.AttributeValue{LedgerDoneAttribute: doneNow()}
	return lg.g.transactWith(ctx, k, token, items, done, true)
}

// doneNow is the done mark: the time, in RFC 3339 with nanoseconds.
func doneNow() *types.AttributeValueMemberS {
	return &types.AttributeValueMemberS{Value: time.Now().UTC().Format(time.RFC3339Nano)}
}
