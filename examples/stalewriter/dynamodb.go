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
	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/lease"
)

// dynamoTarget is the DynamoDB item the workers also write with --dynamodb:
// the item pk=Key of Table, a table of the run's own (string key pk).
type dynamoTarget struct {
	Endpoint string `json:"endpoint"`
	Table    string `json:"table"`
	Key      string `json:"key"`
}

func (d *dynamoTarget) key() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: d.Key}}
}

// writeItem writes the report to the DynamoDB item: through dynamoguard (a
// conditional PutItem on lock_version), or with a plain PutItem when
// unguarded.
func (w *worker) writeItem(ctx context.Context, l *lease.Lease, note string) {
	d := w.cfg.Dynamo
	tok, sent, deadline := l.Token(), time.Now(), l.Deadline()
	client, closeClient := services.NewDynamoClient(d.Endpoint)
	defer closeClient()
	item := d.key()
	item["written_by"] = &types.AttributeValueMemberS{Value: w.cfg.Role}
	item["token"] = &types.AttributeValueMemberN{Value: strconv.FormatUint(uint64(tok), 10)}
	item["note"] = &types.AttributeValueMemberS{Value: note}
	var err error
	if w.cfg.Unguarded {
		_, err = client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(d.Table), Item: item})
	} else {
		var g *dynamoguard.Guard
		if g, err = dynamoguard.New(client, d.Table); err == nil {
			err = g.Put(ctx, item, tok)
		}
	}
	w.reportWrite(event{Store: "dynamodb", Token: tok, Sent: sent, Deadline: deadline}, err, fmt.Sprintf("item dynamodb://%s/%s", d.Table, d.Key))
}

// setUpDynamo creates the run's DynamoDB table (--dynamodb) at
// $FENCE_DYNAMODB_ENDPOINT.
func (sc *scenario) setUpDynamo(ctx context.Context, id string) error {
	ep, err := demo.DynamoEndpoint("--dynamodb")
	if err != nil {
		return err
	}
	if sc.dynamo, err = demo.CreateRunTable(ctx, ep, "stalewriter-"+id, false); err != nil {
		return err
	}
	sc.cfg.Dynamo = &dynamoTarget{Endpoint: ep, Table: sc.dynamo.Name, Key: "report/2026-11"}
	return nil
}

// tearDownDynamo deletes the run's DynamoDB table, if it made one.
func (sc *scenario) tearDownDynamo(ctx context.Context) error {
	if sc.dynamo == nil {
		return nil
	}
	return sc.dynamo.Delete(ctx)
}

// readFinalItem reads who wrote the DynamoDB item last and with which token
// (lock_version when guarded, the token the writer stored otherwise).
func (sc *scenario) readFinalItem(ctx context.Context, f *finalState) error {
	d := sc.cfg.Dynamo
	if d == nil {
		return nil
	}
	f.Item = true
	client, closeClient := services.NewDynamoClient(d.Endpoint)
	defer closeClient()
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(d.Table), Key: d.key(), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return err
	}
	if out.Item == nil {
		return errors.New("the DynamoDB item was never written")
	}
	if by, ok := out.Item["written_by"].(*types.AttributeValueMemberS); ok {
		f.ItemWrittenBy = by.Value
	}
	attr := "token"
	if !sc.cfg.Unguarded {
		attr = dynamoguard.DefaultVersionAttribute
	}
	if n, ok := out.Item[attr].(*types.AttributeValueMemberN); ok {
		v, err := strconv.ParseUint(n.Value, 10, 64)
		if err != nil {
			return fmt.Errorf("the DynamoDB item's %s %q: %w", attr, n.Value, err)
		}
		f.ItemToken = fence.Token(v)
	}
	return nil
}

// itemLine is the final state's line for the DynamoDB item, if there is one.
func itemLine(f finalState) string {
	if !f.Item {
		return ""
	}
	return fmt.Sprintf("  item:   written by %s, token %d\n", orNone(f.ItemWrittenBy), f.ItemToken)
}
