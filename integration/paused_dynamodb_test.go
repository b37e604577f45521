package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/holder"
	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// TestPausedHolderDynamoDB: a holder process takes a DynamoDB lease and
// writes an item through dynamoguard; it is frozen with SIGSTOP; the lease
// passes to this test (after it has watched the holder's record version
// for a TTL); the new holder writes with its newer token; the old holder
// is thawed with SIGCONT and writes again with its old token, and
// DynamoDB refuses that write: the item keeps the new holder's value and
// token.
func TestPausedHolderDynamoDB(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dynamotest.Client(t)
	leases, data := dynamotest.TableName(t, "leases"), dynamotest.TableName(t, "data")
	if err := dynamolease.CreateTable(ctx, c, leases, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dynamotest.Delete(context.Background(), c, leases) })
	dynamotest.CreateTable(t, c, data, dynamotest.Key{Name: "pk", Type: types.ScalarAttributeTypeS})
	const ttl = time.Second

	h := itest.StartHolder(t, "-store", "dynamodb", "-leases", leases, "-dynamo-data", data, "-name", "job", "-item", "invoice", "-ttl", ttl.String(), "-do", "commands")
	old := h.Next(holder.KindAcquired, time.Minute).Token
	h.Send("write")
	if ev := h.Next(holder.KindWrite, time.Minute); ev.Outcome != holder.Accepted {
		t.Fatalf("the holder's first write: %+v", ev)
	}

	h.Signal(syscall.SIGSTOP)
	b, err := dynamolease.New(c, leases)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lease.NewManager(b, ttl)
	if err != nil {
		t.Fatal(err)
	}
	l, err := m.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("Acquire while the holder is frozen: %v", err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	if l.Token() <= old {
		t.Fatalf("new token %d not greater than the frozen holder's %d", l.Token(), old)
	}
	g, err := dynamoguard.New(c, data)
	if err != nil {
		t.Fatal(err)
	}
	mine := fmt.Sprintf("new holder %d", l.Token())
	if err := g.Put(ctx, map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "invoice"}, "value": &types.AttributeValueMemberS{Value: mine},
	}, l.Token()); err != nil {
		t.Fatal(err)
	}

	h.Signal(syscall.SIGCONT)
	h.Send("write")
	if ev := h.Next(holder.KindWrite, time.Minute); ev.Outcome != holder.Stale || ev.Token != old || ev.Current != l.Token() {
		t.Fatalf("the thawed holder's write: %+v, want stale, refused for token %d", ev, l.Token())
	}
	item, tok, err := g.Get(ctx, map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "invoice"}})
	if err != nil {
		t.Fatal(err)
	}
	if tok != l.Token() || item["value"].(*types.AttributeValueMemberS).Value != mine {
		t.Fatalf("stored: %v with token %d, want %q with token %d", item["value"], tok, mine, l.Token())
	}
	h.CloseInput()
}

// TestPausedClientDynamoDB runs the stale-writer demo with its leases in
// DynamoDB and its report also written to a DynamoDB item (--lease-store
// dynamodb --dynamodb): worker A is frozen past its TTL, B takes the lease
// and writes everywhere, and A's late writes are rejected by sqlguard,
// blobguard and dynamoguard; the item ends with B's token.
func TestPausedClientDynamoDB(t *testing.T) {
	dynamotest.MustEndpoint()
	s3Client(t) // fail first if the S3 server is not configured
	jsonPath := filepath.Join(t.TempDir(), "summary.json")
	out, err := exec.Command(stalewriterBinary(t), "--lease-store", "dynamodb", "--dynamodb", "--ttl", "1s", "--pause", "3s", "--resume-after-b", "--json", jsonPath).CombinedOutput()
	if err != nil {
		t.Fatalf("the demo: %v\n%s", err, out)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		OK     bool        `json:"ok"`
		TokenA fence.Token `json:"token_a"`
		TokenB fence.Token `json:"token_b"`
		Writes []struct {
			Role    string `json:"role"`
			Store   string `json:"store"`
			Outcome string `json:"outcome"`
		} `json:"writes"`
		Final struct {
			Item          bool        `json:"item"`
			ItemWrittenBy string      `json:"item_written_by"`
			ItemToken     fence.Token `json:"item_token"`
		} `json:"final"`
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	if !sum.OK || sum.TokenB <= sum.TokenA {
		t.Fatalf("ok %v, tokens A %d B %d\n%s", sum.OK, sum.TokenA, sum.TokenB, out)
	}
	if !sum.Final.Item || sum.Final.ItemWrittenBy != "B" || sum.Final.ItemToken != sum.TokenB {
		t.Fatalf("the DynamoDB item: %+v, want written by B with token %d\n%s", sum.Final, sum.TokenB, out)
	}
	rejected := false
	for _, w := range sum.Writes {
		if w.Role == "A" && w.Store == "dynamodb" {
			rejected = w.Outcome == "stale"
		}
	}
	if !rejected {
		t.Fatalf("A's DynamoDB write was not rejected as stale: %+v\n%s", sum.Writes, out)
	}
}
