package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// invoiceJobSummary is the part of the invoice job's --json summary this
// test reads.
type invoiceJobSummary struct {
	OK         bool   `json:"ok"`
	Verdict    string `json:"verdict"`
	Period     string `json:"period"`
	Customers  int    `json:"customers"`
	LeaseStore string `json:"lease_store"`
	Rows       struct {
		Store    string `json:"store"`
		Schema   string `json:"schema"`
		DynamoDB *struct {
			Endpoint string `json:"endpoint"`
			Table    string `json:"table"`
		} `json:"dynamodb"`
	} `json:"rows"`
	Holders []struct {
		Replica string      `json:"replica"`
		Token   fence.Token `json:"token"`
		Written int         `json:"invoices_written"`
	} `json:"holders"`
	Handovers []struct {
		From      string      `json:"from"`
		FromToken fence.Token `json:"from_token"`
	} `json:"handovers"`
	Checks []struct {
		OK   bool   `json:"ok"`
		Text string `json:"text"`
	} `json:"checks"`
	Replays []struct {
		Replica string      `json:"replica"`
		Token   fence.Token `json:"token"`
		Stale   bool        `json:"stale"`
		Current fence.Token `json:"current"`
		Error   string      `json:"error"`
	} `json:"replays"`
}

// TestInvoiceJobDynamoDB runs the invoice job (examples/invoicejob) as the
// program it is, with its leases and its fenced rows in DynamoDB (DynamoDB
// Local at FENCE_DYNAMODB_ENDPOINT): three replicas, two holders killed
// with SIGKILL mid-batch. It asserts the job's own verdict and checks from
// its JSON summary (every killed holder's replayed write rejected as stale,
// naming a newer token), then reads the run's table itself (--keep leaves
// it) and checks the invoices, the progress item and the fence against the
// holders' tokens.
func TestInvoiceJobDynamoDB(t *testing.T) {
	c := dynamotest.Client(t) // fails without FENCE_DYNAMODB_ENDPOINT
	const customers, kills = 24, 2
	js := filepath.Join(t.TempDir(), "summary.json")
	// A 2 s TTL: DynamoDB Local (a JVM) answered slower than a 500 ms
	// lease's renew interval allows on a loaded 2-core machine (load 11),
	// and a replica that loses its lease mid-batch stops, as it must.
	cmd := exec.Command(exampleBinary(t, "invoicejob"), "--lease-store", "dynamodb", "--row-store", "dynamodb",
		"--ttl", "2s", "--replicas", "3", "--customers", strconv.Itoa(customers), "--kill-after", "5", "--kills", strconv.Itoa(kills),
		"--invoice-time", "20ms", "--keep", "--json", js)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running the invoice job: %v\n%s", err, out)
	}
	b, rerr := os.ReadFile(js)
	if rerr != nil {
		t.Fatalf("the job exited (%v) without a summary: %v\n%s", err, rerr, out)
	}
	var sum invoiceJobSummary
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("summary: %v", err)
	}
	t.Cleanup(func() { removeInvoiceJobRun(t, c, sum) })
	if err != nil || !sum.OK {
		t.Errorf("exit %v, ok %v; want exit 0 and ok: %s", err, sum.OK, sum.Verdict)
	}
	for _, ch := range sum.Checks {
		if !ch.OK {
			t.Errorf("the job's check failed: %s", ch.Text)
		}
	}
	if sum.LeaseStore != "dynamodb" || sum.Rows.Store != "dynamodb" || sum.Rows.DynamoDB == nil {
		t.Fatalf("leases in %q, rows in %q (%+v); want both in DynamoDB\n%s", sum.LeaseStore, sum.Rows.Store, sum.Rows.DynamoDB, out)
	}
	if len(sum.Handovers) != kills || len(sum.Holders) != 3 {
		t.Fatalf("%d handovers, %d holders; want %d and 3\n%s", len(sum.Handovers), len(sum.Holders), kills, out)
	}
	for _, k := range sum.Handovers {
		rejected := false
		for _, r := range sum.Replays {
			if r.Replica == k.From && r.Token == k.FromToken {
				rejected = r.Stale && r.Current > r.Token
			}
		}
		if !rejected {
			t.Errorf("the replayed write of killed %s (token %d) was not reported rejected as stale: %+v", k.From, k.FromToken, sum.Replays)
		}
	}
	checkInvoiceTable(t, c, sum)
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// checkInvoiceTable reads the run's DynamoDB table with the test's own
// client: one invoice per customer numbered 1..N, each with the
// lock_version of a holder that wrote invoices, in token order along the
// numbers, the killed holders' tokens among them; the progress item
// complete; the fence item at the newest holder's token.
func checkInvoiceTable(t *testing.T, c *dynamodb.Client, sum invoiceJobSummary) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table := sum.Rows.DynamoDB.Table
	tokens := map[fence.Token]string{}
	for _, h := range sum.Holders {
		tokens[h.Token] = h.Replica
	}
	q, err := c.Query(ctx, &dynamodb.QueryInput{
		TableName: aws.String(table), KeyConditionExpression: aws.String("pk = :pk"), ConsistentRead: aws.Bool(true),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "invoice#" + sum.Period}},
	})
	if err != nil {
		t.Fatalf("query the invoices: %v", err)
	}
	if len(q.Items) != sum.Customers || q.LastEvaluatedKey != nil {
		t.Fatalf("%d invoice items (more: %v), want %d", len(q.Items), q.LastEvaluatedKey != nil, sum.Customers)
	}
	var prev fence.Token
	seen := map[fence.Token]int{}
	for i, item := range q.Items { // in customer order, the sort key
		n, tok := itemNumber(t, item, "number"), fence.Token(itemNumber(t, item, "lock_version"))
		by, _ := item["written_by"].(*types.AttributeValueMemberS)
		if n != uint64(i+1) || by == nil || tokens[tok] != by.Value || tok < prev {
			t.Errorf("invoice %d: number %d, lock_version %d, written by %s (holder of that token: %q; previous token %d)", i+1, n, tok, by, tokens[tok], prev)
		}
		prev = tok
		seen[tok]++
	}
	for _, k := range sum.Handovers {
		if seen[k.FromToken] == 0 {
			t.Errorf("no invoice carries killed %s's token %d", k.From, k.FromToken)
		}
	}
	p := getItem(t, ctx, c, table, "progress", sum.Period)
	if _, done := p["completed_at"]; !done || itemNumber(t, p, "next_index") != uint64(sum.Customers) {
		t.Errorf("progress item %v: want next_index %d and completed_at", p, sum.Customers)
	}
	newest := sum.Holders[len(sum.Holders)-1].Token
	if f := getItem(t, ctx, c, table, "fence", "invoices/"+sum.Period); fence.Token(itemNumber(t, f, "lock_version")) != newest {
		t.Errorf("fence item %v: want lock_version %d, the newest holder's", f, newest)
	}
}

func getItem(t *testing.T, ctx context.Context, c *dynamodb.Client, table, pk, sk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: sk}}})
	if err != nil || out.Item == nil {
		t.Fatalf("get %s/%s: %v (found: %v)", pk, sk, err, out != nil && out.Item != nil)
	}
	return out.Item
}

func itemNumber(t *testing.T, item map[string]types.AttributeValue, name string) uint64 {
	t.Helper()
	n, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		t.Fatalf("attribute %s missing or not a number in %v", name, item)
	}
	v, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil {
		t.Fatalf("attribute %s: %v", name, err)
	}
	return v
}

// removeInvoiceJobRun removes what the run kept (--keep): its DynamoDB
// table and its PostgreSQL schema.
func removeInvoiceJobRun(t *testing.T, c *dynamodb.Client, sum invoiceJobSummary) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if d := sum.Rows.DynamoDB; d != nil {
		if err := dynamotest.Delete(ctx, c, d.Table); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	}
	if sum.Rows.Schema == "" {
		return
	}
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		t.Errorf("cleaning up: %v", err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{sum.Rows.Schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("cleaning up: %v", err)
	}
}
