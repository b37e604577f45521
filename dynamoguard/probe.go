package dynamoguard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/fencekit/fencekit/fence"
	"math/big"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// keyAttr is one key attribute of the table.
type keyAttr struct {
	name string
	typ  types.ScalarAttributeType
}

// keySchema is the table's partition key and optional sort key.
type keySchema struct {
	partition, sort keyAttr // sort.name == "" without a sort key
}

// String names the key attributes with their types: "pk (S), sk (N)".
func (s keySchema) String() string {
	var b strings.Builder
	for i, a := range s.attrs() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s)", a.name, a.typ)
	}
	return b.String()
}

func (s keySchema) attrs() []keyAttr {
	if s.sort.name == "" {
		return []keyAttr{s.partition}
	}
	return []keyAttr{s.partition, s.sort}
}

// keySchema returns the table's key schema as the last probe read it.
func (g *Guard) keySchema() keySchema {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.schema
}

// keyOf returns the key attributes of item (an item or a key), checked
// against the table's schema.
func (g *Guard) keyOf(item map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	key := make(map[string]types.AttributeValue, 2)
	var errs []error
	for _, a := range g.keySchema().attrs() {
		av, ok := item[a.name]
		if !ok {
			errs = append(errs, fmt.Errorf("%w: the key attribute %q of table %s is missing", fence.ErrInvalidArgument, a.name, g.table))
			continue
		}
		if !hasType(av, a.typ) {
			errs = append(errs, fmt.Errorf("%w: the key attribute %q of table %s must be of type %s, not %T", fence.ErrInvalidArgument, a.name, g.table, a.typ, av))
			continue
		}
		key[a.name] = av
	}
	return key, errors.Join(errs...)
}

func hasType(av types.AttributeValue, t types.ScalarAttributeType) bool {
	switch av.(type) {
	case *types.AttributeValueMemberS:
		return t == types.ScalarAttributeTypeS
	case *types.AttributeValueMemberN:
		return t == types.ScalarAttributeTypeN
	case *types.AttributeValueMemberB:
		return t == types.ScalarAttributeTypeB
	}
	return false
}

// Check is the Guard's start-up check, as lease.Manager.Check is a lease
// backend's: it checks that the table exists and may be used, reads its
// key schema, and checks that the server honours what the fence rests on,
// in the guard's table (it needs DescribeTable, PutItem, GetItem,
// DeleteItem and TransactWriteItems there). On a fresh scratch key:
//
//  1. a PutItem conditional on attribute_not_exists(lock_version), which
//     must succeed (it stores token 5);
//  2. a PutItem conditional on lock_version <= 3, which must fail with
//     ConditionalCheckFailedException and return the stored item, token 5
//     (ReturnValuesOnConditionCheckFailure=ALL_OLD);
//  3. a TransactWriteItems of a PutItem of a second scratch key and an
//     Update of the first conditional on lock_version <= 3, which must be
//     canceled with the reason ConditionalCheckFailed and the stored item,
//     and must leave the second key absent (read back consistently);
//
// then deletes its scratch items. It returns nil when the table is fit; a
// *fence.SetupError naming the fix (matching fence.ErrSetup, and so
// lease.ErrSetup) when it is not: one wrapping ErrConditionsIgnored when
// the server fails a check (the guard then refuses every call with that
// error until a later Check succeeds: fail closed), one matching
// fence.ErrNoTable for a missing table, one carrying the server's error
// for refused access or credentials, or for a key attribute named as one
// of the guard's; and other errors (the server cannot be reached) as they
// are. Every call runs it on first use, and again after an error that is
// not a verdict; call Check when the program starts to learn of a setup
// problem then. ctx bounds the check.
func (g *Guard) Check(ctx context.Context) error { return g.gate.Probe(ctx, g.probe) }

func (g *Guard) ensureProbed(ctx context.Context) error { return g.gate.Ensure(ctx, g.probe) }

type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// probe reads the key schema and runs the checks; its verdict (nil or a
// refusal) is kept by the gate, another error is not.
func (g *Guard) probe(ctx context.Context) (bool, error) {
	schema, err := g.describe(ctx)
	if err != nil {
		return false, err
	}
	g.mu.Lock()
	g.schema = schema
	g.mu.Unlock()
	err = g.runProbe(ctx, schema)
	_, refused := err.(refusal)
	return err == nil || refused, err
}

func (g *Guard) describe(ctx context.Context) (keySchema, error) {
	out, err := g.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(g.table)})
	if err != nil {
		return keySchema{}, g.mapError(fmt.Errorf("dynamoguard: describe table %s: %w", g.table, err))
	}
	if out.Table == nil {
		return keySchema{}, fmt.Errorf("dynamoguard: describe table %s: no description returned", g.table)
	}
	types := map[string]types.ScalarAttributeType{}
	for _, d := range out.Table.AttributeDefinitions {
		types[aws.ToString(d.AttributeName)] = d.AttributeType
	}
	var s keySchema
	for _, k := range out.Table.KeySchema {
		a := keyAttr{name: aws.ToString(k.AttributeName), typ: types[aws.ToString(k.AttributeName)]}
		if k.KeyType == "HASH" {
			s.partition = a
		} else {
			s.sort = a
		}
	}
	if s.partition.name == "" {
		return keySchema{}, fmt.Errorf("dynamoguard: describe table %s: no partition key in the answer", g.table)
	}
	for _, a := range s.attrs() {
		switch a.name {
		case g.opts.VersionAttribute, g.opts.NonceAttribute, g.opts.DeletedAttribute:
			return keySchema{}, fence.Setup("name the guard's attributes otherwise (WithAttributes), or use a table keyed by other attributes",
				"dynamoguard: table %s uses %q, one of the guard's attributes, as a key", g.table, a.name)
		}
	}
	return s, nil
}

// scratchKey makes a random key of the table's schema.
func scratchKey(s keySchema) (map[string]types.AttributeValue, error) {
	key := map[string]types.AttributeValue{}
	for _, a := range s.attrs() {
		n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
		if err != nil {
			return nil, err
		}
		switch a.typ {
		case types.ScalarAttributeTypeN:
			key[a.name] = &types.AttributeValueMemberN{Value: n.String()}
		case types.ScalarAttributeTypeB:
			key[a.name] = &types.AttributeValueMemberB{Value: append([]byte(".fencekit-probe-"), n.Bytes()...)}
		default:
			key[a.name] = &types.AttributeValueMemberS{Value: ".fencekit-probe-" + n.String()}
		}
	}
	return key, nil
}

func (g *Guard) runProbe(ctx context.Context, s keySchema) error {
	k1, err := scratchKey(s)
	if err != nil {
		return err
	}
	k2, err := scratchKey(s)
	if err != nil {
		return err
	}
	defer func() {
		// Best effort: a scratch item left behind is harmless.
		for _, k := range []map[string]types.AttributeValue{k1, k2} {
			_, _ = g.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(g.table), Key: k})
		}
	}()
	res := g.resource(k1)
	refuse := func(what string) error {
		return refusal{conditionsIgnored("%s: %s", res, what)}
	}
	lv := g.opts.VersionAttribute
	names := map[string]string{"#lv": lv}
	with := func(key map[string]types.AttributeValue, token string) map[string]types.AttributeValue {
		item := map[string]types.AttributeValue{lv: &types.AttributeValueMemberN{Value: token}}
		for k, v := range key {
			item[k] = v
		}
		return item
	}

	// 1. A create on a fresh key.
	if _, err := g.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(g.table), Item: with(k1, "5"),
		ConditionExpression: aws.String("attribute_not_exists(#lv)"), ExpressionAttributeNames: names,
	}); err != nil {
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			return refuse("a write conditional on attribute_not_exists of a fresh key failed")
		}
		return g.mapError(fmt.Errorf("dynamoguard: probe: %w", err))
	}

	// 2. An older token: refused, and the stored item returned.
	three := map[string]types.AttributeValue{":t": &types.AttributeValueMemberN{Value: "3"}}
	_, err = g.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(g.table), Item: with(k1, "3"),
		ConditionExpression:                 aws.String("attribute_not_exists(#lv) OR #lv <= :t"),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           three,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return refuse("a PutItem whose condition (lock_version <= 3, with 5 stored) was false succeeded")
	case !errors.As(err, &ccf):
		return fmt.Errorf("dynamoguard: probe: %w", err)
	case ccf.Item == nil:
		return refuse("a failed condition returned no item: ReturnValuesOnConditionCheckFailure=ALL_OLD is ignored")
	}
	if n, ok := ccf.Item[lv].(*types.AttributeValueMemberN); !ok || n.Value != "5" {
		return refuse(fmt.Sprintf("a failed condition returned an item without the stored token 5: %v", ccf.Item[lv]))
	}

	// 3. A transaction with a false condition commits nothing.
	_, err = g.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String(g.table), Item: with(k2, "1")}},
		{Update: &types.Update{
			TableName: aws.String(g.table), Key: k1,
			UpdateExpression:                    aws.String("SET #lv = :t"),
			ConditionExpression:                 aws.String("#lv <= :t"),
			ExpressionAttributeNames:            names,
			ExpressionAttributeValues:           three,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}},
	}})
	var tce *types.TransactionCanceledException
	switch {
	case err == nil:
		return refuse("a transaction with a false condition committed")
	case !errors.As(err, &tce):
		return fmt.Errorf("dynamoguard: probe: transaction: %w", err)
	case len(tce.CancellationReasons) != 2 || aws.ToString(tce.CancellationReasons[1].Code) != "ConditionalCheckFailed":
		return refuse(fmt.Sprintf("a canceled transaction did not name its failed condition: %v", err))
	case tce.CancellationReasons[1].Item == nil:
		return refuse("a canceled transaction did not return the item of its failed condition (ReturnValuesOnConditionCheckFailure)")
	}
	out, err := g.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(g.table), Key: k2, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return fmt.Errorf("dynamoguard: probe: %w", err)
	}
	if out.Item != nil {
		return refuse("a canceled transaction applied one of its writes")
	}
	return nil
}
