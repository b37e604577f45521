package bench

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// httpRequests counts the requests a DynamoDB client sends: one request is
// one round trip. It also counts them by operation (the X-Amz-Target
// header's, such as UpdateItem).
type httpRequests struct {
	next http.RoundTripper
	n    atomic.Int64
	mu   sync.Mutex
	ops  map[string]int64
}

func (h *httpRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	h.n.Add(1)
	op := r.Header.Get("X-Amz-Target")
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		op = op[i+1:]
	}
	h.mu.Lock()
	if h.ops == nil {
		h.ops = map[string]int64{}
	}
	h.ops[op]++
	h.mu.Unlock()
	return h.next.RoundTrip(r)
}

// byOp returns the requests sent so far, by operation.
func (h *httpRequests) byOp() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.ops)
}

// dynamoSetup is one benchmark's DynamoDB (FENCE_DYNAMODB_ENDPOINT): a
// client whose requests are counted, a lease table and a data table keyed
// by the string pk, both deleted at the end.
type dynamoSetup struct {
	c            *dynamodb.Client
	rt           *httpRequests
	leases, data string
}

func newDynamoSetup(b *testing.B) *dynamoSetup {
	b.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	b.Cleanup(tr.CloseIdleConnections)
	s := &dynamoSetup{rt: &httpRequests{next: tr}}
	s.c = dynamotest.ClientVia(b, s.rt)
	s.leases, s.data = dynamotest.TableName(b, "bench-leases"), dynamotest.TableName(b, "bench-data")
	if err := dynamolease.CreateTable(context.Background(), s.c, s.leases, ""); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = dynamotest.Delete(context.Background(), s.c, s.leases) })
	dynamotest.CreateTable(b, s.c, s.data, dynamotest.Key{Name: "pk", Type: types.ScalarAttributeTypeS})
	return s
}

// rawDynamoCycle is the floor of a dynamolease cycle: the backend's two
// conditional UpdateItem requests (grant with the token minted, release
// keeping the token), sent directly.
func rawDynamoCycle(ctx context.Context, c *dynamodb.Client, table, name string) error {
	owner := testkit.RandHex(16)
	key := map[string]types.AttributeValue{"name": &types.AttributeValueMemberS{Value: name}}
	out, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(table),
		Key:                 key,
		UpdateExpression:    aws.String("SET #own = :me, #rvn = :rvn, #ttl = :ttl, #tok = if_not_exists(#tok, :floor) + :one"),
		ConditionExpression: aws.String("attribute_not_exists(#me) AND (attribute_not_exists(#own))"),
		ExpressionAttributeNames: map[string]string{
			"#tok": "token", "#own": "owner", "#rvn": "rvn", "#ttl": "ttl_ms", "#me": "ended:" + owner,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":me": &types.AttributeValueMemberS{Value: owner}, ":rvn": &types.AttributeValueMemberS{Value: testkit.RandHex(16)},
			":ttl":   &types.AttributeValueMemberN{Value: strconv.FormatInt(benchTTL.Milliseconds(), 10)},
			":floor": &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().UnixMicro(), 10)},
			":one":   &types.AttributeValueMemberN{Value: "1"},
		},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err != nil {
		return err
	}
	_, err = c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(table),
		Key:                      key,
		UpdateExpression:         aws.String("SET #rvn = :rvn, #me = :rec REMOVE #own"),
		ConditionExpression:      aws.String("#own = :me AND #tok = :tok"),
		ExpressionAttributeNames: map[string]string{"#rvn": "rvn", "#me": "ended:" + owner, "#own": "owner", "#tok": "token"},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":rvn": &types.AttributeValueMemberS{Value: testkit.RandHex(16)}, ":me": &types.AttributeValueMemberS{Value: owner},
			":tok": out.Attributes["token"],
			":rec": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"how": &types.AttributeValueMemberS{Value: "released"},
				"at":  &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().UnixMilli(), 10)}, "keep": &types.AttributeValueMemberN{Value: "20000"},
			}},
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return err
}

// BenchmarkDynamoCyclePaired is one uncontended acquire+release with a 10 s
// TTL on DynamoDB Local, on one client, paired as BenchmarkCyclePaired
// pairs them (a library cycle and a raw cycle alternately, the ratio of
// their times):
//
//   - lib=fencekit: lease.Manager.TryAcquire + Lease.Release over
//     dynamolease (defaults: auto-renewal on).
//   - lib=raw: the floor, dynamolease's two UpdateItem requests sent
//     directly (against itself: raw-ratio should read 1.00).
//
// Each cycle uses a new lease name, as a fresh name and a released one
// cost the same request. rtts/op is the HTTP requests of the library's
// cycles per cycle. cirello.io/dynamolock/v2 is not compared: the module
// proxy of the development machines does not serve it.
func BenchmarkDynamoCyclePaired(b *testing.B) {
	s := newDynamoSetup(b)
	ctx := context.Background()
	be, err := dynamolease.New(s.c, s.leases)
	if err != nil {
		b.Fatal(err)
	}
	m, err := lease.NewManager(be, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	run := testkit.RandHex(16)[:8]
	raw := func(i int) error { return rawDynamoCycle(ctx, s.c, s.leases, fmt.Sprintf("raw-%s-%d", run, i)) }
	libs := []struct {
		name  string
		cycle func(i int) error
	}{
		{"raw", raw},
		{"fencekit", func(i int) error {
			l, err := m.TryAcquire(ctx, fmt.Sprintf("fk-%s-%d", run, i))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
	}
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			var libRT int64
			counted := func(i int) error {
				n0 := s.rt.n.Load()
				err := lib.cycle(i)
				libRT += s.rt.n.Load() - n0
				return err
			}
			rawT, libT, n := pairbench.Alternate(b, raw, counted)
			pairbench.ReportAlternate(b, "raw", rawT, libT, n)
			b.ReportMetric(float64(libRT)/float64(max(n, 1)), "rtts/op")
		})
	}
}

// BenchmarkDynamoGuardPaired is a write of one 1 KiB item through
// dynamoguard.Guard.Put (a conditional PutItem carrying the token and a
// nonce, ALL_OLD on failure) paired with a plain PutItem of the same item,
// alternately, each to its own key on DynamoDB Local. ns/op is the guarded
// write's mean time; plain-ratio its time over the plain write's.
func BenchmarkDynamoGuardPaired(b *testing.B) {
	s := newDynamoSetup(b)
	ctx := context.Background()
	g, err := dynamoguard.New(s.c, s.data)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Check(ctx); err != nil {
		b.Fatal(err)
	}
	body := &types.AttributeValueMemberS{Value: string(make([]byte, 1024))}
	guarded := func() error {
		return g.Put(ctx, map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "guarded"}, "body": body}, 1)
	}
	plain := func() error {
		_, err := s.c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.data),
			Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "plain"}, "body": body}})
		return err
	}
	plainT, guardT, n := pairbench.Alternate(b, func(int) error { return plain() }, func(int) error { return guarded() })
	pairbench.ReportAlternate(b, "plain", plainT, guardT, n)
}

// BenchmarkDynamoHandoff measures, as BenchmarkHandoff does (same groups,
// waiters and hold times), the time from a holder's release to the next
// holder's acquire on dynamolease, whose waiters poll (DynamoDB pushes
// nothing): lib=fencekit with the Manager's default PollInterval (TTL/2
// capped at 1 s, jittered), and lib=fencekit-poll100ms with PollInterval
// 100 ms. A released lease is taken at the first poll after the release.
func BenchmarkDynamoHandoff(b *testing.B) {
	s := newDynamoSetup(b)
	be, err := dynamolease.New(s.c, s.leases)
	if err != nil {
		b.Fatal(err)
	}
	for _, lib := range []struct {
		name string
		opts []lease.Option
	}{
		{"fencekit", nil},
		{"fencekit-poll100ms", []lease.Option{lease.WithPollInterval(100 * time.Millisecond)}},
	} {
		m, err := lease.NewManager(be, benchTTL, lib.opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("lib="+lib.name, func(b *testing.B) {
			rt0 := s.rt.n.Load()
			runHandoff(b, func(ctx context.Context, name string) (func(context.Context) error, error) {
				l, err := m.Acquire(ctx, lib.name+":"+name)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			})
			b.ReportMetric(float64(s.rt.n.Load()-rt0)/float64(b.N), "rtts/op")
		})
	}
}

// BenchmarkDynamoThroughput is BenchmarkPGThroughput on DynamoDB Local,
// distinct names only: dynamolease's waiters poll (DynamoDB pushes
// nothing), so one contended name measures the poll interval
// (BenchmarkDynamoHandoff does). Run it with -benchtime 300x.
func BenchmarkDynamoThroughput(b *testing.B) {
	s := newDynamoSetup(b)
	be, err := dynamolease.New(s.c, s.leases)
	if err != nil {
		b.Fatal(err)
	}
	m, err := lease.NewManager(be, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	pairbench.ThroughputRuns(b, "lib=fencekit", false, func(name string) error {
		l, err := m.Acquire(ctx, name)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
}

// BenchmarkDynamoRenewLoad is BenchmarkPGRenewLoad on DynamoDB Local
// (pairbench.RenewLoad: 1,000 leases held by one lease.Manager with its
// defaults at TTL 15 s, over a window of b.N seconds; run it with
// -benchtime 10x). Requests are counted at the client, by operation.
//
// Metrics, per 1,000 held leases: reqs/s, the requests DynamoDB receives
// per second; renewals/s, the renewals they carry; UpdateItem/s and any
// other operation's rate.
func BenchmarkDynamoRenewLoad(b *testing.B) {
	s := newDynamoSetup(b)
	be, err := dynamolease.New(s.c, s.leases)
	if err != nil {
		b.Fatal(err)
	}
	renewals := &pairbench.RenewCounter{}
	m, err := lease.NewManager(be, pairbench.RenewTTL, lease.WithObserver(renewals))
	if err != nil {
		b.Fatal(err)
	}
	pairbench.RenewLoad(b, m, renewals, "renew-", 1000, s.rt.byOp)
}
