// Package dynamotest gives tests a real DynamoDB-compatible server: the one
// scripts/services.sh starts (Amazon's DynamoDB Local, in memory, on a free
// loopback port) and exports as FENCE_DYNAMODB_ENDPOINT. It makes clients of
// it and throwaway tables, one per test. It fails loudly when the server
// cannot be had; it never skips.
//
// It is fencekit's own test equipment, a package of this module so that
// the tests of several modules share it without a test-kit module in any
// user's graph (docs/versioning.md). It is not part of the library: its API
// may change in any release, and no library package imports it.
package dynamotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.uber.org/goleak"
)

// EndpointVar names the environment variable with the server's URL.
const EndpointVar = "FENCE_DYNAMODB_ENDPOINT"

// Endpoint returns FENCE_DYNAMODB_ENDPOINT, or an error saying how to get a
// server when it is not set.
func Endpoint() (string, error) {
	if ep := os.Getenv(EndpointVar); ep != "" {
		return ep, nil
	}
	return "", fmt.Errorf("dynamotest: %s is not set: these tests need a real DynamoDB-compatible server; "+
		"run ./scripts/test.sh, or `. scripts/services.sh && ensure_dynamodb` (it starts DynamoDB Local) and run the tests in that shell", EndpointVar)
}

// MustEndpoint is for TestMain: it returns the endpoint, or prints why there
// is none and exits with status 2 (a missing service fails loudly).
func MustEndpoint() string {
	ep, err := Endpoint()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return ep
}

// RunMain is a test package's TestMain body: it fails at once (status 2,
// saying how to get a server) without FENCE_DYNAMODB_ENDPOINT, runs the
// tests, and then fails if goroutines leaked. Use it as
// os.Exit(dynamotest.RunMain(m)).
func RunMain(m *testing.M) int {
	MustEndpoint()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// NewClient returns a client of the server at endpoint that sends its
// requests through rt (nil: a transport of its own). The credentials are
// fixed dummies (DynamoDB Local runs with -sharedDb, so any will do); the SDK
// retries with its standard retryer, its backoff capped at 20 ms. optFns
// change the options further.
func NewClient(endpoint string, rt http.RoundTripper, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "fencekit", SecretAccessKey: "fencekit", Source: "fencekit test"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxBackoff = 20 * time.Millisecond
		}),
	}, optFns...)
}

// Client returns a client of the test server whose transport's idle
// connections are closed when t ends. It fails t if the server is not set
// or does not answer.
func Client(t testing.TB, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	t.Helper()
	return ClientVia(t, nil, optFns...)
}

// ClientVia is Client with the requests sent through rt (a fault-injecting
// or counting transport); nil means a transport of its own.
func ClientVia(t testing.TB, rt http.RoundTripper, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	t.Helper()
	ep, err := Endpoint()
	if err != nil {
		t.Fatal(err)
	}
	if rt == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(tr.CloseIdleConnections)
		rt = tr
	}
	return NewClient(ep, rt, optFns...)
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// TableName returns a table name unique to this run, made from prefix and
// t's name (DynamoDB allows 3 to 255 characters of a-z, A-Z, 0-9, _ . -).
func TableName(t testing.TB, prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	base := unsafeChars.ReplaceAllString(prefix+"-"+t.Name(), "_")
	if len(base) > 200 {
		base = base[:200]
	}
	return strings.Trim(base, "_") + "-" + hex.EncodeToString(b[:])
}

// Key describes a table's partition key (and optional sort key).
type Key struct {
	Name string
	Type types.ScalarAttributeType
	// SortName and SortType describe the sort key; SortName "" means none.
	SortName string
	SortType types.ScalarAttributeType
}

// CreateTable creates table with the key schema (on-demand billing), waits
// until it is active, and deletes it when t ends. It fails t on any error.
func CreateTable(t testing.TB, c *dynamodb.Client, table string, key Key) {
	t.Helper()
	createThenDelete(t, c, table, func(ctx context.Context, table string) error {
		return Create(ctx, c, table, key)
	})
}

// NewTable creates a table of its own for t, named TableName(t, prefix),
// with create (a schema of the caller's: a lease table, say), and deletes
// it through c when t ends; it returns the table's name. create must
// return once the table is active; it and the delete are bounded by a
// minute each. It fails t on any error.
func NewTable(t testing.TB, c *dynamodb.Client, prefix string, create func(ctx context.Context, table string) error) string {
	t.Helper()
	table := TableName(t, prefix)
	createThenDelete(t, c, table, create)
	return table
}

func createThenDelete(t testing.TB, c *dynamodb.Client, table string, create func(ctx context.Context, table string) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := create(ctx, table); err != nil {
		t.Fatalf("dynamotest: create table %s: %v", table, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := Delete(ctx, c, table); err != nil {
			t.Errorf("dynamotest: delete table %s: %v", table, err)
		}
	})
}

// Create creates table with the key schema and waits until it is active.
func Create(ctx context.Context, c *dynamodb.Client, table string, key Key) error {
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(key.Name), AttributeType: key.Type},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(key.Name), KeyType: types.KeyTypeHash},
		},
	}
	if key.SortName != "" {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(key.SortName), AttributeType: key.SortType})
		in.KeySchema = append(in.KeySchema, types.KeySchemaElement{AttributeName: aws.String(key.SortName), KeyType: types.KeyTypeRange})
	}
	if _, err := c.CreateTable(ctx, in); err != nil {
		return err
	}
	return dynamodb.NewTableExistsWaiter(c, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 20*time.Millisecond, 200*time.Millisecond
	}).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, time.Minute)
}

// Delete deletes table; a table that does not exist is no error.
func Delete(ctx context.Context, c *dynamodb.Client, table string) error {
	_, err := c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return nil
	}
	return err
}
