package dynamolease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// TestRestoreThenRaiseTokens: a restore from a backup brings back items
// with older tokens (simulated by putting back the items as they were
// when the "backup" was taken: DynamoDB Local has no backups). Without
// help the next grant would get a token a running holder already has;
// after RaiseTokens with the current time in microseconds, every name's
// next token is above every token handed out before the restore, and the
// restored holder's grant is gone.
func TestRestoreThenRaiseTokens(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	c := dynamotest.Client(t)
	b := newBackend(t, table)
	names := []string{"a", "b", "c"}
	newest := map[string]fence.Token{}
	backup := map[string]*dynamodb.GetItemOutput{}
	for _, n := range names {
		g, err := b.Acquire(testkit.Context(t), driver.Request{Name: n, Owner: "before-" + n, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.GetItem(testkit.Context(t), &dynamodb.GetItemInput{TableName: aws.String(table), Key: keyOf(n), ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		backup[n] = out // the backup: taken while before-<n> held the name
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
		for i := range 3 { // grants after the backup
			g, err := b.Acquire(testkit.Context(t), driver.Request{Name: n, Owner: "after-" + n + string(rune('0'+i)), TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			newest[n] = g.Token
			if i < 2 {
				if err := b.Release(testkit.Context(t), g); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, n := range names { // the restore
		if _, err := c.PutItem(testkit.Context(t), &dynamodb.PutItemInput{TableName: aws.String(table), Item: backup[n].Item}); err != nil {
			t.Fatal(err)
		}
	}
	raised, err := dynamolease.RaiseTokens(testkit.Context(t), c, table, "", fence.Token(time.Now().UnixMicro()))
	if err != nil || raised != len(names) {
		t.Fatalf("RaiseTokens = %d, %v; want %d raised", raised, err, len(names))
	}
	if again, err := dynamolease.RaiseTokens(testkit.Context(t), c, table, "", fence.Token(time.Now().UnixMicro()-int64(time.Hour/time.Microsecond))); err != nil || again != 0 {
		t.Fatalf("RaiseTokens with a lower floor = %d, %v; want 0 raised (tokens never go down)", again, err)
	}
	b2 := newBackend(t, table)
	for _, n := range names {
		g, err := b2.Acquire(testkit.Context(t), driver.Request{Name: n, Owner: "next-" + n, TTL: time.Minute})
		if err != nil {
			t.Fatalf("%s: Acquire after the raise: %v", n, err)
		}
		if g.Token <= newest[n] {
			t.Errorf("%s: token %d after the restore and raise, not above %d handed out before", n, g.Token, newest[n])
		}
	}
	if _, err := dynamolease.RaiseTokens(testkit.Context(t), c, table, "", fence.None); !errors.Is(err, dynamolease.ErrInvalidInput) {
		t.Fatalf("RaiseTokens with floor 0 = %v, want ErrInvalidInput", err)
	}
}
