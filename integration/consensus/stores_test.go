package consensus

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testenv"
	"github.com/fencekit/fencekit/sqlguard"
)

// fencedStores is one row in a throwaway PostgreSQL schema and one object
// in the S3 bucket, both written only through the guards, and removed when
// the test ends. The services come from FENCE_POSTGRES_URL and FENCE_S3_*
// (./scripts/test.sh starts them).
type fencedStores struct {
	pool   *pgxpool.Pool
	schema string
	table  *sqlguard.Table
	rowID  string
	s3     *s3.Client
	bucket string
	key    string
	guard  *blobguard.Guard
}

func newFencedStores(t *testing.T) *fencedStores {
	t.Helper()
	ctx := ctxT(t)
	env := testenv.S3Config()
	if env.Endpoint == "" || env.AccessKey == "" || env.SecretKey == "" || env.Bucket == "" {
		t.Fatalf("%s, %s, %s and %s must be set: run the tests through ./scripts/test.sh, or `. scripts/services.sh; ensure_s3` first",
			testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar, testenv.S3BucketVar)
	}
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatalf("PostgreSQL at %s: %v", testenv.PostgresURL(), err)
	}
	t.Cleanup(pool.Close)
	fs := &fencedStores{pool: pool, schema: "zklease_" + randHex(6), rowID: "report-1", bucket: env.Bucket, key: "zklease-test/" + randHex(8)}
	sch := pgx.Identifier{fs.schema}.Sanitize()
	for _, q := range []string{
		"CREATE SCHEMA " + sch,
		"CREATE TABLE " + sch + ".reports (id text PRIMARY KEY, written_by text NOT NULL, lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+sch+" CASCADE")
	})
	if _, err := pool.Exec(ctx, "INSERT INTO "+sch+".reports (id, written_by) VALUES ($1, 'nobody')", fs.rowID); err != nil {
		t.Fatal(err)
	}
	if fs.table, err = sqlguard.NewTable(fs.schema, "reports", "id"); err != nil {
		t.Fatal(err)
	}
	fs.s3 = s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(env.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(env.AccessKey, env.SecretKey, ""),
	})
	if fs.guard, err = blobguard.New(fs.s3, env.Bucket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = fs.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(fs.bucket), Key: aws.String(fs.key)})
	})
	return fs
}

// writeRow is a fenced UPDATE of the row with tok.
func (fs *fencedStores) writeRow(ctx context.Context, tok fence.Token, who string) error {
	return fs.table.Update(ctx, fs.pool, tok, []any{fs.rowID}, sqlguard.Col("written_by", who))
}

// writeObject is a fenced put of the object with tok.
func (fs *fencedStores) writeObject(ctx context.Context, tok fence.Token, who string) error {
	body, _ := json.Marshal(map[string]any{"written_by": who, "token": tok})
	_, err := fs.guard.Put(ctx, fs.key, tok, strings.NewReader(string(body)))
	return err
}

// stored reads who wrote the row and the object last, and their tokens.
func (fs *fencedStores) stored(t *testing.T) (rowBy string, rowTok fence.Token, objBy string, objTok fence.Token) {
	t.Helper()
	ctx := ctxT(t)
	var v int64
	if err := fs.pool.QueryRow(ctx, "SELECT written_by, lock_version FROM "+pgx.Identifier{fs.schema, "reports"}.Sanitize()+" WHERE id = $1", fs.rowID).Scan(&rowBy, &v); err != nil {
		t.Fatalf("read the row: %v", err)
	}
	obj, err := fs.guard.Get(ctx, fs.key)
	if err != nil {
		t.Fatalf("read the object: %v", err)
	}
	var body struct {
		WrittenBy string `json:"written_by"`
	}
	if err := json.Unmarshal(obj.Body, &body); err != nil {
		t.Fatalf("object body %q: %v", obj.Body, err)
	}
	return rowBy, fence.Token(v), body.WrittenBy, obj.Token()
}

// requireStale fails unless err is a stale-token rejection.
func requireStale(t *testing.T, what string, err error) {
	t.Helper()
	se, ok := fence.AsStale(err)
	if !ok {
		t.Fatalf("%s: want a stale-token rejection, got %v", what, err)
	}
	t.Logf("%s rejected: presented %d, the store had accepted %d", what, se.Presented, se.Current)
}
