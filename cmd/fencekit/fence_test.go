package main

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/sqlguard"
)

// fenceCLI runs fence advance with env as its variables.
func fenceCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	return leaseStore{env: env}.cli(t, testkit.Context(t), nil, append([]string{"fence", "advance"}, args...)...)
}

// checkAdvanced checks the outcomes of a push to token 7 (accepted), a
// write with token 6 through the guard (stale, naming 7) and a push back
// to 5 (refused, naming 7).
func checkAdvanced(t *testing.T, push func(token string) (int, string, string), write func(fence.Token) error) {
	t.Helper()
	if code, out, errOut := push("7"); code != exitOK || !strings.Contains(out, "to token 7") {
		t.Fatalf("fence advance --token 7 = %d, %q, %q", code, out, errOut)
	}
	var stale *fence.StaleError
	if err := write(6); !errors.As(err, &stale) || stale.Current != 7 {
		t.Fatalf("a guarded write with token 6 after the push to 7 = %v, want stale against 7", err)
	}
	if code, _, errOut := push("5"); code != exitFail || !strings.Contains(errOut, "already has token 7, newer than 5") {
		t.Fatalf("fence advance --token 5 after 7 = %d, %q; want a refusal naming token 7", code, errOut)
	}
	if err := write(7); err != nil {
		t.Fatalf("a guarded write with the pushed token 7: %v", err)
	}
}

// A row's lock_version on PostgreSQL (sqlguard.Table).
func TestFenceAdvancePostgresRow(t *testing.T) {
	t.Parallel()
	schema, db := newSchema(t)
	for _, q := range []string{
		"CREATE TABLE " + schema + ".invoices (id bigint PRIMARY KEY, total int NOT NULL, lock_version bigint NOT NULL DEFAULT 0)",
		"INSERT INTO " + schema + ".invoices (id, total, lock_version) VALUES (42, 10, 3)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.New(testkit.Context(t), testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tbl, err := sqlguard.NewTable(schema, "invoices", "id")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{databaseURLVar: testenv.PostgresURL()}
	checkAdvanced(t,
		func(tok string) (int, string, string) {
			return fenceCLI(t, env, "--token", tok, "--table", schema+".invoices", "--key", "id=42")
		},
		func(tok fence.Token) error {
			return tbl.Update(testkit.Context(t), pool, []any{int64(42)}, tok, sqlguard.Col("total", 11))
		})
	var total int
	if err := db.QueryRow("SELECT total FROM " + schema + ".invoices WHERE id = 42").Scan(&total); err != nil || total != 11 {
		t.Fatalf("total = %d, %v; fence advance must change no column, the last write set 11", total, err)
	}
	if code, _, errOut := fenceCLI(t, env, "--token", "9", "--table", schema+".invoices", "--key", "id=43"); code != exitFail || !strings.Contains(errOut, "not found") {
		t.Fatalf("fence advance of a missing row = %d, %q", code, errOut)
	}
}

// A resource token and a row on SQLite (dbguard).
func TestFenceAdvanceSQLite(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "app.db")
	if code, _, errOut := fencekit(t, "migrate", "up", "--dialect", "sqlite", "--database-url", file); code != exitOK {
		t.Fatalf("migrate up: %s", errOut)
	}
	db, err := sql.Open("sqlite", file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	g, err := dbguard.New(dbguard.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	checkAdvanced(t,
		func(tok string) (int, string, string) {
			return fenceCLI(t, nil, "--store", "sqlite", "--url", file, "--token", tok, "nightly-report")
		},
		func(tok fence.Token) error {
			return g.BeginFunc(testkit.Context(t), db, "nightly-report", tok, func(*sql.Tx) error { return nil })
		})
}

// An item's fence on DynamoDB Local (dynamoguard).
func TestFenceAdvanceDynamoDBItem(t *testing.T) {
	t.Parallel()
	ep, err := dynamotest.Endpoint()
	if err != nil {
		t.Fatal(err)
	}
	c := dynamotest.Client(t)
	table := dynamotest.TableName(t, "fence")
	dynamotest.CreateTable(t, c, table, dynamotest.Key{Name: "pk", Type: types.ScalarAttributeTypeS})
	g, err := dynamoguard.New(c, table)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t)
	item := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "acct-1"}, "balance": &types.AttributeValueMemberN{Value: "5"}}
	if err := g.Put(ctx, item, 2); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{dynamoEndpoint: ep, "AWS_ACCESS_KEY_ID": "fencekit", "AWS_SECRET_ACCESS_KEY": "fencekit"}
	checkAdvanced(t,
		func(tok string) (int, string, string) {
			return fenceCLI(t, env, "--store", "dynamodb", "--table", table, "--key", "pk=acct-1", "--token", tok)
		},
		func(tok fence.Token) error { return g.Put(ctx, item, tok) })
}

// An object's fence on S3 (blobguard, versitygw): the body is kept.
func TestFenceAdvanceS3Object(t *testing.T) {
	t.Parallel()
	cfg := testenv.S3Config()
	if cfg.Endpoint == "" {
		t.Fatalf("%s is not set: these tests need an S3-compatible server; run ./scripts/test.sh, or `. scripts/services.sh && ensure_s3`", testenv.S3EndpointVar)
	}
	c := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(cfg.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, "")})
	g, err := blobguard.New(c, cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t)
	key := "fencekit-cli/" + testkit.RandHex(6)
	if _, err := g.Put(ctx, key, 3, strings.NewReader("ledger v1")); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"FENCE_S3_ENDPOINT": cfg.Endpoint, "FENCE_S3_ACCESS_KEY": cfg.AccessKey, "FENCE_S3_SECRET_KEY": cfg.SecretKey}
	push := func(tok string) (int, string, string) {
		return fenceCLI(t, env, "--store", "s3", "--bucket", cfg.Bucket, "--token", tok, key)
	}
	if code, out, errOut := push("7"); code != exitOK {
		t.Fatalf("fence advance --token 7 = %d, %q, %q", code, out, errOut)
	}
	obj, err := g.Get(ctx, key)
	if err != nil || obj.Token() != 7 || string(obj.Body) != "ledger v1" {
		t.Fatalf("after fence advance: %v, %v; want token 7 and the body kept", obj, err)
	}
	var stale *fence.StaleError
	if _, err := g.Put(ctx, key, 6, strings.NewReader("ledger v2")); !errors.As(err, &stale) {
		t.Fatalf("a write with token 6 after the push to 7 = %v, want stale", err)
	}
	if code, _, errOut := push("5"); code != exitFail || !strings.Contains(errOut, "newer than 5") {
		t.Fatalf("fence advance --token 5 after 7 = %d, %q; want a refusal", code, errOut)
	}
	if obj, err := g.Get(ctx, key); err != nil || obj.Token() != 7 {
		t.Fatalf("a refused push changed the object: %v, %v", obj, err)
	}
}

func TestFenceAdvanceUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"r"}, "--token is required"},
		{[]string{"--token", "0", "r"}, "--token is required"},
		{[]string{"--token", "9223372036854775808", "r"}, "invalid token"},
		{[]string{"--token", "1"}, "either a RESOURCE or a row"},
		{[]string{"--token", "1", "--table", "t", "r"}, "either a RESOURCE or a row"},
		{[]string{"--token", "1", "--table", "t"}, "--table needs --key"},
		{[]string{"--token", "1", "--key", "id"}, "not COL=VALUE"},
		{[]string{"--token", "1", "--store", "dynamodb", "r"}, "--store dynamodb takes --table"},
		{[]string{"--token", "1", "--store", "s3", "k"}, "--store s3 takes --bucket"},
		{[]string{"--token", "1", "--store", "nope", "r"}, "unknown --store"},
		{[]string{"--token", "1", "-o", "yaml", "r"}, "-o is table or json"},
	} {
		code, _, errOut := fenceCLI(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("fence advance %q = %d, %q; want usage error %q", tc.args, code, errOut, tc.want)
		}
	}
	if code, out, _ := (leaseStore{}).cli(t, context.Background(), nil, "fence", "help"); code != exitOK || !strings.Contains(out, "never lowered") {
		t.Errorf("fence help = %d, %q", code, out)
	}
}
