package dynamoguard_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
)

// The tests run against the real DynamoDB-compatible server that
// scripts/services.sh starts (DynamoDB Local) and exports as
// FENCE_DYNAMODB_ENDPOINT; without it they fail.
func TestMain(m *testing.M) { os.Exit(dynamotest.RunMain(m)) }

// newTable creates a throwaway table keyed by the string "pk".
func newTable(t testing.TB) string {
	t.Helper()
	table := dynamotest.TableName(t, "guard")
	dynamotest.CreateTable(t, dynamotest.Client(t), table, dynamotest.Key{Name: "pk", Type: types.ScalarAttributeTypeS})
	return table
}

// newGuard returns a guard over client for table that has probed the
// server.
func newGuard(t testing.TB, client dynamoguard.Client, table string, opts ...dynamoguard.Option) *dynamoguard.Guard {
	t.Helper()
	g, err := dynamoguard.New(client, table, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(testkit.Context(t)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return g
}

func key(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}}
}

func item(pk, value string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "value": &types.AttributeValueMemberS{Value: value}}
}

// faultTransport sits between a client and the server. It counts the
// requests it sends; armed with loseNext, it lets the next request reach
// the server, drops the answer and fails the request with a connection
// reset, and, if partition is also set, fails every later request until
// heal is called (as a network partition right after the server applied
// the write would).
type faultTransport struct {
	next        *http.Transport
	requests    atomic.Int64
	loseNext    atomic.Bool
	partition   atomic.Bool
	partitioned atomic.Bool
}

func newFaultTransport(t testing.TB) *faultTransport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &faultTransport{next: tr}
}

var errReset = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer (injected by the test)")}

func (f *faultTransport) heal() { f.partitioned.Store(false) }

func (f *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f.requests.Add(1)
	if f.partitioned.Load() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, errReset
	}
	if f.loseNext.Swap(false) {
		resp, err := f.next.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if f.partition.Load() {
			f.partitioned.Store(true)
		}
		return nil, errReset
	}
	return f.next.RoundTrip(req)
}

// client returns a client of the test server through f.
func (f *faultTransport) client(t testing.TB, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamotest.ClientVia(t, f, optFns...)
}
