package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/services"
)

// dynamoRows is the batch's rows in DynamoDB (--row-store dynamodb): items
// of one table of the run's own, keyed by pk and sk (strings):
//
//	pk "invoice#<period>", sk <customer>   an invoice: number, amount_cents, written_by, written_at, lock_version
//	pk "progress", sk <period>             the progress item: next_index, completed_at once done, lock_version
//	pk "fence", sk "invoices/<period>"     the resource's fence item (dynamoguard's: lock_version, lock_nonce)
//
// Each step is one TransactWriteItems through dynamoguard.Guard.Transact:
// the fence item advanced to the holder's token, beside the invoice's Put
// and the progress item's Update, so that a holder with an older token
// commits none of them. DynamoDB transactions cannot read, so the step reads
// the progress item first (a strongly consistent GetItem) and makes the
// writes conditional on what it read: the invoice must not exist, the
// progress item must still hold the position read. A write that lost such
// a race is canceled (dynamoguard.ErrCanceled), and nothing is written.
type dynamoRows struct {
	client    *dynamodb.Client
	guard     *dynamoguard.Guard
	table     string
	period    string
	customers []customer
}

// Key values of the items.
const (
	dynamoProgressPK = "progress"
	dynamoFencePK    = "fence"
)

func newDynamoRows(endpoint, table, period string, customers []customer) (*dynamoRows, func(), error) {
	client, closeClient := services.NewDynamoClient(endpoint)
	g, err := dynamoguard.New(client, table)
	if err != nil {
		closeClient()
		return nil, nil, err
	}
	return &dynamoRows{client: client, guard: g, table: table, period: period, customers: customers}, closeClient, nil
}

func (d *dynamoRows) where() string { return "DynamoDB" }

func itemKey(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": str(pk), "sk": str(sk)}
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num[T int | int64 | uint64](n T) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: fmt.Sprint(n)}
}

func (d *dynamoRows) invoicePK() string { return "invoice#" + d.period }

func (d *dynamoRows) progressKey() map[string]types.AttributeValue {
	return itemKey(dynamoProgressPK, d.period)
}

func (d *dynamoRows) fenceKey() map[string]types.AttributeValue {
	return itemKey(dynamoFencePK, resourceFor(d.period))
}

// createProgress puts the period's progress item, nothing done yet (the
// orchestrator, before the replicas start).
func (d *dynamoRows) createProgress(ctx context.Context) error {
	item := d.progressKey()
	item["next_index"] = num(0)
	_, err := d.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(d.table), Item: item,
		ConditionExpression: aws.String("attribute_not_exists(pk)")})
	return err
}

// step: see rows.step. The fence is checked in every step, the one that
// finds the batch complete too (a transaction of the fence alone), as
// PostgreSQL's transaction advances the resource before it reads.
func (d *dynamoRows) step(ctx context.Context, tok fence.Token, replica string, render time.Duration, seen func(next int, done bool)) (stepResult, error) {
	var st stepResult
	p, err := d.readProgress(ctx)
	if err != nil {
		return st, fmt.Errorf("reading the progress item: %w", err)
	}
	st.next = p.next
	if seen != nil {
		seen(p.next, p.completed)
	}
	switch {
	case p.completed:
		st.outcome = evNothing
		return st, d.guard.Transact(ctx, d.fenceKey(), tok, nil)
	case p.next >= len(d.customers):
		st.outcome = evCompleted
		return st, d.guard.Transact(ctx, d.fenceKey(), tok, []types.TransactWriteItem{d.progressUpdate(tok, p.next,
			"completed_at = :now", map[string]types.AttributeValue{":now": str(time.Now().UTC().Format(time.RFC3339Nano))})})
	}
	st.outcome, st.customer = evInvoice, d.customers[p.next]
	if err := rendering(ctx, render); err != nil {
		return st, err
	}
	return st, d.replay(ctx, tok, replica, p.next)
}

// replay writes invoice #at+1 and moves the progress item to at+1: one
// transaction of the fence, the invoice's Put (only if the invoice does not
// exist) and the progress item's Update (only if it is still at at).
func (d *dynamoRows) replay(ctx context.Context, tok fence.Token, replica string, at int) error {
	c := d.customers[at]
	inv := itemKey(d.invoicePK(), c.ID)
	inv["number"] = num(at + 1)
	inv["amount_cents"] = num(c.AmountCents)
	inv["written_by"] = str(replica)
	inv["written_at"] = str(time.Now().UTC().Format(time.RFC3339Nano))
	inv[dynamoguard.DefaultVersionAttribute] = num(uint64(tok))
	err := d.guard.Transact(ctx, d.fenceKey(), tok, []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String(d.table), Item: inv, ConditionExpression: aws.String("attribute_not_exists(pk)")}},
		d.progressUpdate(tok, at, "next_index = :next", map[string]types.AttributeValue{":next": num(at + 1)}),
	})
	if err != nil {
		return fmt.Errorf("invoice #%d for %s: %w", at+1, c.ID, err)
	}
	return nil
}

// progressUpdate is the progress item's fenced Update in a transaction: set
// is the SET action (with values), and lock_version = tok, on the
// condition that the item is at position at, not complete, and not
// written with a newer token.
func (d *dynamoRows) progressUpdate(tok fence.Token, at int, set string, values map[string]types.AttributeValue) types.TransactWriteItem {
	values[":at"], values[":tok"] = num(at), num(uint64(tok))
	return types.TransactWriteItem{Update: &types.Update{
		TableName:        aws.String(d.table),
		Key:              d.progressKey(),
		UpdateExpression: aws.String("SET " + set + ", #lv = :tok"),
		ConditionExpression: aws.String("next_index = :at AND attribute_not_exists(completed_at) AND " +
			"(attribute_not_exists(#lv) OR #lv <= :tok)"),
		ExpressionAttributeNames:  map[string]string{"#lv": dynamoguard.DefaultVersionAttribute},
		ExpressionAttributeValues: values,
	}}
}

// progress is the progress item as read.
type progress struct {
	next      int
	completed bool
	tok       fence.Token
}

func (d *dynamoRows) readProgress(ctx context.Context) (progress, error) {
	out, err := d.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(d.table), Key: d.progressKey(), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return progress{}, err
	}
	if out.Item == nil {
		return progress{}, errors.New("no progress item")
	}
	var p progress
	var next, tok uint64
	errs := []error{numberOf(out.Item, "next_index", &next), numberOf(out.Item, dynamoguard.DefaultVersionAttribute, &tok)}
	_, p.completed = out.Item["completed_at"]
	p.next, p.tok = int(next), fence.Token(tok)
	return p, errors.Join(errs...)
}

func (d *dynamoRows) read(ctx context.Context) (stored, error) {
	var s stored
	p, err := d.readProgress(ctx)
	if err != nil {
		return s, fmt.Errorf("the progress item: %w", err)
	}
	s.next, s.completed, s.progressTok = p.next, p.completed, p.tok
	if s.invoices, err = d.readInvoices(ctx); err != nil {
		return s, err
	}
	_, s.resource, err = d.guard.Get(ctx, d.fenceKey())
	var nf *fence.NotFoundError
	if errors.As(err, &nf) && nf.Tombstone == fence.None {
		err = nil // nobody wrote
	}
	return s, err
}

// readInvoices queries the period's invoices, in customer order (the sort
// key), with strongly consistent reads.
func (d *dynamoRows) readInvoices(ctx context.Context) ([]invoice, error) {
	pages := dynamodb.NewQueryPaginator(d.client, &dynamodb.QueryInput{
		TableName:                 aws.String(d.table),
		KeyConditionExpression:    aws.String("pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(d.invoicePK())},
		ConsistentRead:            aws.Bool(true),
	})
	var out []invoice
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, item := range page.Items {
			var inv invoice
			var n, lv uint64
			err := errors.Join(stringOf(item, "sk", &inv.Customer), stringOf(item, "written_by", &inv.WrittenBy),
				numberOf(item, "number", &n), numberOf(item, dynamoguard.DefaultVersionAttribute, &lv))
			if err != nil {
				return nil, fmt.Errorf("an invoice item: %w", err)
			}
			inv.Number, inv.LockVersion = int(n), fence.Token(lv)
			out = append(out, inv)
		}
	}
	return out, nil
}

// numberOf reads the number attribute name of item into v (0 if missing).
func numberOf(item map[string]types.AttributeValue, name string, v *uint64) error {
	av, ok := item[name]
	if !ok {
		return nil
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return fmt.Errorf("attribute %s is not a number", name)
	}
	x, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil {
		return fmt.Errorf("attribute %s: %w", name, err)
	}
	*v = x
	return nil
}

// stringOf reads the string attribute name of item into v.
func stringOf(item map[string]types.AttributeValue, name string, v *string) error {
	s, ok := item[name].(*types.AttributeValueMemberS)
	if !ok {
		return fmt.Errorf("attribute %s is missing or not a string", name)
	}
	*v = s.Value
	return nil
}
