package demo

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

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
	client, closeClient := NewDynamoClient(store.DynamoEndpoint)
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

// NewDynamoClient returns a DynamoDB client of endpoint (DynamoDB Local:
// any credentials do, so it sends fixed ones) and a function that closes
// its idle connections.
func NewDynamoClient(endpoint string) (*dynamodb.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "fencekit", SecretAccessKey: "fencekit", Source: "fencekit demo"}, nil
		}),
		HTTPClient: &http.Client{Transport: tr},
	}), tr.CloseIdleConnections
}

// dynamoStore fills in the DynamoDB fields of a LeaseStore of that kind.
func dynamoStore(st LeaseStore) LeaseStore {
	if st.Kind == LeaseDynamoDB {
		st.DynamoEndpoint, st.DynamoTable = os.Getenv(DynamoEndpointVar), DynamoTable
	}
	return st
}
