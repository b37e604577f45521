package dynamolease_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

func keyOf(name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"name": &types.AttributeValueMemberS{Value: name}}
}

func rawItem(t *testing.T, table, name string) map[string]types.AttributeValue {
	t.Helper()
	out, err := dynamotest.Client(t).GetItem(testkit.Context(t), &dynamodb.GetItemInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true), Key: keyOf(name),
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// TestTakeoverWaitsOutRecordVersion: a lease whose holder stopped renewing
// goes to a waiter only after the waiter has seen its record version
// unchanged for the TTL the item carries, on the waiter's own clock; a
// renewal in between (a new record version) starts the wait again.
func TestTakeoverWaitsOutRecordVersion(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	holder, waiter := newBackend(t, table), newBackend(t, table)
	const ttl = 600 * time.Millisecond
	g, err := holder.Acquire(testkit.Context(t), driver.Request{Name: "job", Owner: "h", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	try := func() (driver.Grant, error) {
		return waiter.Acquire(testkit.Context(t), driver.Request{Name: "job", Owner: "w", TTL: ttl})
	}
	_, err = try()
	firstSeen := time.Now()
	var na *lease.NotAcquiredError
	if !errors.As(err, &na) || na.RetryAfter <= 0 || na.RetryAfter > ttl {
		t.Fatalf("first Acquire by a waiter = %v, want a NotAcquiredError with RetryAfter in (0, %v]", err, ttl)
	}
	// The holder renews before the waiter's wait is over: a new version.
	time.Sleep(ttl / 3)
	if err := holder.Renew(testkit.Context(t), g); err != nil {
		t.Fatal(err)
	}
	// Past one TTL from the first sight, but the version changed: refused.
	time.Sleep(time.Until(firstSeen.Add(ttl + 50*time.Millisecond)))
	_, err = try()
	secondSeen := time.Now()
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire a TTL after the first sight, the holder having renewed since = %v, want ErrNotAcquired", err)
	}
	// Now the version stays: the waiter gets it, not before a TTL from the
	// reply that showed it the new version.
	var g2 driver.Grant
	deadline := time.Now().Add(10 * ttl)
	for {
		g2, err = try()
		if err == nil {
			break
		}
		if !errors.Is(err, lease.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("Acquire after the holder stopped renewing: %v", err)
		}
		time.Sleep(ttl / 10)
	}
	if since := time.Since(secondSeen); since < ttl-ttl/3 {
		// The renewal came at most ttl/3 after the first sight; the
		// waiter saw the new version no earlier than the renewal.
		t.Fatalf("taken %v after the waiter saw the renewed version, less than the TTL %v allows", since, ttl)
	}
	if g2.Token <= g.Token {
		t.Fatalf("token %d after a takeover, not greater than %d", g2.Token, g.Token)
	}
	if err := holder.Renew(testkit.Context(t), g); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew by the holder that was taken over = %v, want ErrNotHeld", err)
	}
}

// TestReleaseKeepsTheToken: a release frees the name but never deletes the
// item, so the token counter survives it.
func TestReleaseKeepsTheToken(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	b := newBackend(t, table)
	g, err := b.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(testkit.Context(t), g); err != nil {
		t.Fatal(err)
	}
	it := rawItem(t, table, "n")
	if _, held := it["owner"]; held {
		t.Fatalf("owner still recorded after release: %v", it)
	}
	tok, ok := it["token"].(*types.AttributeValueMemberN)
	if !ok || tok.Value != strconv.FormatUint(uint64(g.Token), 10) {
		t.Fatalf("token after release = %v, want %d", it["token"], g.Token)
	}
	if _, ok := it["ended:a"]; !ok {
		t.Fatalf("the released owner is not recorded as ended: %v", it)
	}
}

// TestOldEndedOwnersArePruned: an ended-owner record older than
// driver.EndedOwnerTTL plus Options.PruneAfter is removed by a later
// Acquire; a fresh one stays.
func TestOldEndedOwnersArePruned(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	c := dynamotest.Client(t)
	old := time.Now().Add(-time.Hour).UnixMilli()
	_, err := c.UpdateItem(testkit.Context(t), &dynamodb.UpdateItemInput{
		TableName:                aws.String(table),
		Key:                      map[string]types.AttributeValue{"name": &types.AttributeValueMemberS{Value: "n"}},
		UpdateExpression:         aws.String("SET #o = :rec"),
		ExpressionAttributeNames: map[string]string{"#o": "ended:ancient"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":rec": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"how": &types.AttributeValueMemberS{Value: "released"}, "at": &types.AttributeValueMemberN{Value: strconv.FormatInt(old, 10)},
			"keep": &types.AttributeValueMemberN{Value: "10000"},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, table)
	for _, owner := range []string{"a", "b"} {
		g, err := b.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: owner, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
	}
	it := rawItem(t, table, "n")
	if _, ok := it["ended:ancient"]; ok {
		t.Fatalf("an ended owner an hour old was not pruned: %v", it)
	}
	for _, owner := range []string{"a", "b"} {
		if _, ok := it["ended:"+owner]; !ok {
			t.Fatalf("the fresh ended owner %q was pruned: %v", owner, it)
		}
	}
}

// TestCheck: a missing table or one with another key is a setup error
// naming the fix; the right table passes, and Check writes nothing.
func TestCheck(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	if err := newBackend(t, table).Check(testkit.Context(t)); err != nil {
		t.Fatalf("Check of a lease table: %v", err)
	}
	m, err := lease.NewManager(newBackend(t, table+"-missing"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var se *lease.SetupError
	if err := m.Check(testkit.Context(t)); !errors.Is(err, lease.ErrSetup) || !errors.As(err, &se) || se.Fix == "" {
		t.Fatalf("Manager.Check of a missing table = %v, want a SetupError with a fix", err)
	}
	if _, err := m.TryAcquire(testkit.Context(t), "n"); !errors.Is(err, lease.ErrSetup) {
		t.Fatalf("TryAcquire on a missing table = %v, want ErrSetup", err)
	}
	other := dynamotest.TableName(t, "otherkey")
	dynamotest.CreateTable(t, dynamotest.Client(t), other, dynamotest.Key{Name: "id", Type: types.ScalarAttributeTypeS})
	if err := newBackend(t, other).Check(testkit.Context(t)); !errors.Is(err, lease.ErrSetup) {
		t.Fatalf("Check of a table keyed by id = %v, want ErrSetup", err)
	}
	if _, err := dynamolease.New(nil, "", dynamolease.WithPruneAfter(-1)); !errors.Is(err, dynamolease.ErrInvalidInput) {
		t.Fatalf("New with bad input = %v, want ErrInvalidInput", err)
	}
}
