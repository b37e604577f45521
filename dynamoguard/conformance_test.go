package dynamoguard_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
)

// TestConformance runs the guard conformance suite against the real
// server for each kind of write: Put (creates or replaces the item),
// Update (changes an existing item; a key never written is missing) and
// Transact (the value item and the fence item written in one
// TransactWriteItems). Each resource has a guard of its own whose client
// sends through a faultTransport, which counts requests and loses a reply
// on cue.
func TestConformance(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	seed := dynamotest.Client(t)
	var seq atomic.Int64
	for _, mode := range []string{"Put", "Update", "Transact"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			newRes := func(t *testing.T, create bool) guardtest.Resource {
				r := &confItem{mode: mode, pk: fmt.Sprintf("%s-%d", mode, seq.Add(1)), tr: newFaultTransport(t), table: table}
				r.client = r.tr.client(t)
				r.g = newGuard(t, r.client, table)
				r.base = r.tr.requests.Load()
				if create && mode == "Update" {
					// An existing item that no guard wrote yet.
					if _, err := seed.PutItem(testkit.Context(t), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item(r.pk, "")}); err != nil {
						t.Fatal(err)
					}
				}
				return r
			}
			cfg := guardtest.Config{
				NewResource: func(t *testing.T) guardtest.Resource { return newRes(t, true) },
				CountIO:     func(r guardtest.Resource) int64 { c := r.(*confItem); return c.tr.requests.Load() - c.base },
				LoseReply: func(t *testing.T, r guardtest.Resource) {
					c := r.(*confItem)
					c.tr.partition.Store(true)
					c.tr.loseNext.Store(true)
				},
				Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
					c := r.(*confItem)
					c.g = newGuard(t, c.client, table, dynamoguard.WithObserver(o))
					op := map[string]string{"Put": "put", "Update": "update", "Transact": "transaction"}[mode]
					return guardtest.Want{Guard: "dynamoguard", Class: table, Op: op, Resource: "dynamodb://" + table + "/" + c.pk}
				},
				Check: func(ctx context.Context, r guardtest.Resource) error { return r.(*confItem).g.Check(ctx) },
				// A guard of a table that does not exist.
				NewBroken: func(t *testing.T) guardtest.Resource {
					r := &confItem{mode: mode, pk: fmt.Sprintf("%s-%d", mode, seq.Add(1)), tr: newFaultTransport(t), table: dynamotest.TableName(t, "absent")}
					r.client = r.tr.client(t)
					var err error
					if r.g, err = dynamoguard.New(r.client, r.table); err != nil {
						t.Fatal(err)
					}
					return r
				},
			}
			if mode == "Update" {
				cfg.NewMissing = func(t *testing.T) guardtest.Resource { return newRes(t, false) }
				cfg.IsMissing = func(err error) bool { return errors.Is(err, fence.ErrNotFound) }
			} else {
				cfg.Lacks = map[guardtest.Capability]string{
					guardtest.Missing: mode + " creates a missing item: no target is missing",
				}
			}
			guardtest.Run(t, cfg)
		})
	}
}

// confItem is one item written through one Guard.
type confItem struct {
	mode   string
	pk     string
	table  string
	tr     *faultTransport
	client *dynamodb.Client
	g      *dynamoguard.Guard
	base   int64 // requests sent before the suite started (the probe's)
}

func (r *confItem) Write(ctx context.Context, token fence.Token, value string) error {
	defer r.tr.heal()
	switch r.mode {
	case "Put":
		return r.g.Put(ctx, item(r.pk, value), token)
	case "Update":
		return r.g.Update(ctx, key(r.pk), token, expression.Set(expression.Name("value"), expression.Value(value)))
	default:
		// The value lives in its own item; the fence is the item r.pk.
		return r.g.Transact(ctx, key(r.pk), token, []types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String(r.table), Item: item(r.pk+"/value", value)}},
		})
	}
}

func (r *confItem) Read(ctx context.Context) (string, fence.Token, error) {
	switch r.mode {
	case "Transact":
		_, tok, err := r.g.Get(ctx, key(r.pk))
		if errors.Is(err, fence.ErrNotFound) {
			return "", fence.None, nil
		}
		if err != nil {
			return "", fence.None, err
		}
		v, _, err := r.g.Get(ctx, key(r.pk+"/value"))
		if err != nil {
			return "", fence.None, err
		}
		return v["value"].(*types.AttributeValueMemberS).Value, tok, nil
	default:
		v, tok, err := r.g.Get(ctx, key(r.pk))
		if errors.Is(err, fence.ErrNotFound) {
			return "", fence.None, nil
		}
		if err != nil {
			return "", fence.None, err
		}
		return v["value"].(*types.AttributeValueMemberS).Value, tok, nil
	}
}
