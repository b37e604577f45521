package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// LeaseDynamoDB keeps leases in DynamoDB (package dynamolease): one item
// per lease in the table DynamoTable at $FENCE_DYNAMODB_ENDPOINT (DynamoDB
// Local, which scripts/services.sh starts with ensure_dynamodb; any
// credentials do). Waiters poll, and a dead holder's lease is taken once a
// waiter has seen its record version unchanged for a TTL.
const LeaseDynamoDB = "dynamodb"

// DynamoEndpointVar names the DynamoDB endpoint's environment variable.
const DynamoEndpointVar = "FENCE_DYNAMODB_ENDPOINT"

// DynamoTable is the table the demos keep their leases in: one small item
// per run's lease name stays in it (the item is never deleted: it keeps
// the name's token).
const DynamoTable = "fencekit-demo-leases"

// dynamoLag is how late past its TTL a dead holder's DynamoDB lease is
// taken: a waiter sees the last renewal's record version at its next poll
// (the Manager's PollInterval, at most 1 s), then waits a TTL from there.
const dynamoLag = time.Second

// newDynamoBackend returns a dynamolease backend on store's endpoint,
// creating the demo table if it is missing.
func newDynamoBackend(store LeaseStore) (consensusBackend, func(), error) {
	if store.DynamoEndpoint == "" {
		return nil, nil, fmt.Errorf("%s is not set: start DynamoDB Local (. scripts/services.sh && ensure_dynamodb) and export it", DynamoEndpointVar)
	}
	client, closeClient := services.NewDynamoClient(store.DynamoEndpoint)
	tr := struct{ CloseIdleConnections func() }{closeClient}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dynamolease.CreateTable(ctx, client, store.DynamoTable, ""); err != nil {
		tr.CloseIdleConnections()
		return nil, nil, fmt.Errorf("DynamoDB at %s: %w", store.DynamoEndpoint, err)
	}
	b, err := dynamolease.New(client, store.DynamoTable)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, nil, err
	}
	if err := b.Check(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, nil, fmt.Errorf("DynamoDB at %s: %w", store.DynamoEndpoint, err)
	}
	return b, tr.CloseIdleConnections, nil
}

// dynamoStore fills in the DynamoDB fields of a LeaseStore of that kind.
func dynamoStore(st LeaseStore) LeaseStore {
	if st.Kind == LeaseDynamoDB {
		st.DynamoEndpoint, st.DynamoTable = os.Getenv(DynamoEndpointVar), DynamoTable
	}
	return st
}

// DynamoEndpoint returns $FENCE_DYNAMODB_ENDPOINT, or an error saying how to
// get a server; what names the flag that needs it.
func DynamoEndpoint(what string) (string, error) {
	if ep := os.Getenv(DynamoEndpointVar); ep != "" {
		return ep, nil
	}
	return "", fmt.Errorf("%s: %s is not set: start DynamoDB Local (. scripts/services.sh && ensure_dynamodb) and export it", what, DynamoEndpointVar)
}

// RunTable is a DynamoDB table of a run's own (string keys pk and, if it
// has one, sk; on-demand capacity). It is recorded in the run's ledger
// (package leftover) before it is created, so that the next run's sweep
// deletes it if this run is killed.
type RunTable struct {
	Endpoint string `json:"endpoint"`
	Name     string `json:"table"`
	done     func()
}

// CreateRunTable creates the table name at endpoint, keyed by pk (S) and,
// with sortKey, sk (S), and waits until it is active. name must be
// "<program>-<8 hex digits>" for the sweep to delete it.
func CreateRunTable(ctx context.Context, endpoint, name string, sortKey bool) (*RunTable, error) {
	t := &RunTable{Endpoint: endpoint, Name: name}
	t.done = leftover.Track(leftover.Entry{Kind: leftover.KindDynamoTable, URL: endpoint, Name: name})
	client, closeClient := services.NewDynamoClient(endpoint)
	defer closeClient()
	attrs := []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}}
	keys := []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}}
	if sortKey {
		attrs = append(attrs, types.AttributeDefinition{AttributeName: aws.String("sk"), AttributeType: types.ScalarAttributeTypeS})
		keys = append(keys, types.KeySchemaElement{AttributeName: aws.String("sk"), KeyType: types.KeyTypeRange})
	}
	if _, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(name), BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: attrs, KeySchema: keys,
	}); err != nil {
		t.done()
		return nil, fmt.Errorf("DynamoDB at %s: create table %s: %w", endpoint, name, err)
	}
	if err := dynamodb.NewTableExistsWaiter(client).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, time.Minute); err != nil {
		return nil, errors.Join(fmt.Errorf("DynamoDB at %s: table %s: %w", endpoint, name, err), t.Delete(context.WithoutCancel(ctx)))
	}
	return t, nil
}

// Delete deletes the table and strikes it off the run's ledger. ctx bounds
// the request.
func (t *RunTable) Delete(ctx context.Context) error {
	client, closeClient := services.NewDynamoClient(t.Endpoint)
	defer closeClient()
	if _, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(t.Name)}); err != nil {
		return fmt.Errorf("DynamoDB at %s: delete table %s: %w", t.Endpoint, t.Name, err)
	}
	t.done()
	return nil
}

// Keep strikes the table off the run's ledger without deleting it (--keep).
func (t *RunTable) Keep() { t.done() }
