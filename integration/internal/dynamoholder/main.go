// Command dynamoholder is a lease holder on DynamoDB for the paused-holder
// test (integration/paused_dynamodb_test.go). It acquires -name through
// lease.Manager over lease/dynamolease (table -leases), writes the item
// -item of table -data once through dynamoguard with its token, then, for
// every line "write" on standard input, writes it again with the same
// token, whatever has happened to its lease (a holder that never looks,
// the worst case). Each step is a JSON line on standard output (see
// Event). The server comes from FENCE_DYNAMODB_ENDPOINT. Exit status: 0 at
// the end of its input, 1 on a failure to set up or acquire, 2 on bad
// flags.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/dynamotest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// Event is one line of output.
type Event struct {
	Kind    string      `json:"kind"` // acquired, write, failed
	Token   fence.Token `json:"token,omitempty"`
	Outcome string      `json:"outcome,omitempty"` // accepted, stale, unknown, error
	Current fence.Token `json:"current,omitempty"` // the token a stale write was refused for
	Text    string      `json:"text,omitempty"`
}

func main() { os.Exit(run()) }

func run() int {
	leases := flag.String("leases", "", "lease table")
	data := flag.String("data", "", "data table (string key pk)")
	name := flag.String("name", "", "lease name")
	item := flag.String("item", "", "key of the item to write")
	ttl := flag.Duration("ttl", time.Second, "lease TTL")
	flag.Parse()
	if *leases == "" || *data == "" || *name == "" || *item == "" {
		fmt.Fprintln(os.Stderr, "dynamoholder: -leases, -data, -name and -item are required")
		return 2
	}
	enc := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = enc.Encode(Event{Kind: "failed", Text: err.Error()})
		return 1
	}
	ep, err := dynamotest.Endpoint()
	if err != nil {
		return fail(err)
	}
	client := dynamotest.NewClient(ep, nil)
	b, err := dynamolease.New(client, *leases)
	if err != nil {
		return fail(err)
	}
	m, err := lease.NewManager(b, *ttl)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := m.Acquire(ctx, *name)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	tok := l.Token()
	_ = enc.Encode(Event{Kind: "acquired", Token: tok})
	g, err := dynamoguard.New(client, *data)
	if err != nil {
		return fail(err)
	}
	write := func() {
		err := g.Put(context.Background(), tok, map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: *item},
			"value": &types.AttributeValueMemberS{Value: fmt.Sprintf("holder %d", tok)},
		})
		ev := Event{Kind: "write", Token: tok, Outcome: "accepted"}
		var se *fence.StaleError
		switch {
		case errors.As(err, &se):
			ev.Outcome, ev.Current = "stale", se.Current
		case errors.Is(err, fence.ErrOutcomeUnknown):
			ev.Outcome, ev.Text = "unknown", err.Error()
		case err != nil:
			ev.Outcome, ev.Text = "error", err.Error()
		}
		_ = enc.Encode(ev)
	}
	write()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "write" {
			write()
		}
	}
	return 0
}
