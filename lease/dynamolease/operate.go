package dynamolease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/lease/driver"
)

// Operating leases: driver.Lister and driver.Revoker.

var (
	_ driver.Lister  = (*Backend)(nil)
	_ driver.Revoker = (*Backend)(nil)
)

// ScanAPI is the part of *dynamodb.Client that List needs besides Client.
type ScanAPI interface {
	Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

// ErrCannotScan is returned by List when the backend's Client has no Scan
// (ScanAPI). *dynamodb.Client has it.
var ErrCannotScan = errors.New("dynamolease: the client cannot scan the table (it needs Scan: see ScanAPI)")

// List implements driver.Lister with a Scan of the table (strongly
// consistent, every page), filtered at the server to the items whose key
// begins with Options.KeyPrefix + prefix and that name an owner. A Scan
// reads the whole table: it costs read capacity in proportion to the
// table's size, not to the result's. Remaining is 0 (the table keeps no
// time) and Waiters 0 (no line). Errors: ErrCannotScan; the SDK's, as
// Holder's.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Status, error) {
	sc, ok := b.client.(ScanAPI)
	if !ok {
		return nil, ErrCannotScan
	}
	var out []driver.Status
	var start map[string]types.AttributeValue
	for {
		page, err := sc.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(b.table), ExclusiveStartKey: start, ConsistentRead: aws.Bool(true),
			FilterExpression:         aws.String("begins_with(#k, :p) AND attribute_exists(#own)"),
			ProjectionExpression:     aws.String("#k, #own, #tok"),
			ExpressionAttributeNames: map[string]string{"#k": b.opts.KeyAttribute, "#own": attrOwner, "#tok": attrToken},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":p": str(b.opts.KeyPrefix + prefix),
			},
		})
		if err != nil {
			return nil, b.storeError("list", prefix, err)
		}
		for _, it := range page.Items {
			k, _ := it[b.opts.KeyAttribute].(*types.AttributeValueMemberS)
			if k == nil || !strings.HasPrefix(k.Value, b.opts.KeyPrefix) {
				continue
			}
			st, err := statusOf(strings.TrimPrefix(k.Value, b.opts.KeyPrefix), it)
			if err != nil {
				return nil, err
			}
			if st.Held() {
				out = append(out, st)
			}
		}
		if len(page.LastEvaluatedKey) == 0 {
			break
		}
		start = page.LastEvaluatedKey
	}
	slices.SortFunc(out, func(a, b driver.Status) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// statusOf reads the status of name from its item.
func statusOf(name string, item map[string]types.AttributeValue) (driver.Status, error) {
	st := driver.Status{Name: name}
	owner, ok := item[attrOwner].(*types.AttributeValueMemberS)
	if !ok {
		return st, nil
	}
	tok, err := tokenOf(item)
	if err != nil {
		return driver.Status{}, fmt.Errorf("dynamolease: read %q: %w", name, err)
	}
	st.Holder = driver.Holder{Name: name, Owner: owner.Value, Token: tok}
	return st, nil
}

// Status implements driver.Lister with Holder's read (a strongly
// consistent GetItem).
func (b *Backend) Status(ctx context.Context, name string) (driver.Status, error) {
	if err := driver.ValidateName(name); err != nil {
		return driver.Status{}, err
	}
	h, err := b.Holder(ctx, name)
	switch {
	case errors.Is(err, driver.ErrNotHeld):
		return driver.Status{Name: name}, nil
	case err != nil:
		return driver.Status{}, err
	}
	return driver.Status{Name: name, Holder: h}, nil
}

// Revoke implements driver.Revoker with one UpdateItem conditional on the
// item naming h.Owner with h.Token: it removes the owner, writes a new
// record version and records the owner as lost (kept for
// driver.RevokedOwnerTTL(h)); the token stays, so the next grant's is
// greater. The name is free at once: a waiter takes it at its next try.
func (b *Backend) Revoke(ctx context.Context, h driver.Holder) error {
	if err := driver.CheckRevoke(h); err != nil {
		return err
	}
	rvn, err := newRVN()
	if err != nil {
		return err
	}
	_, err = b.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(b.table),
		Key:                      b.key(h.Name),
		UpdateExpression:         aws.String("SET #rvn = :rvn, #me = :rec REMOVE #own"),
		ConditionExpression:      aws.String("#own = :me AND #tok = :tok"),
		ExpressionAttributeNames: map[string]string{"#rvn": attrRVN, "#me": endedPrefix + h.Owner, "#own": attrOwner, "#tok": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":rvn": str(rvn), ":rec": endedRecord(howLost, h.Remaining), ":me": str(h.Owner), ":tok": num(uint64(h.Token)),
		},
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return fmt.Errorf("%w: %q is not held by %q with token %d", driver.ErrNotHeld, h.Name, h.Owner, h.Token)
	case err != nil:
		return b.storeError("revoke", h.Name, err)
	}
	return nil
}
