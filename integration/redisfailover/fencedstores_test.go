package redisfailover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations/migrationstest"
	"github.com/fencekit/fencekit/sqlguard"
)

// fencedStores are the stores a lease holder writes to in the failover
// tests, each behind its guard: a row of a PostgreSQL table (sqlguard.Table),
// a PostgreSQL transaction fenced for a resource (sqlguard.Guard.BeginFunc),
// and an S3 object (blobguard, on the versitygw that scripts/services.sh
// starts). Each lives in a throwaway schema or under a unique key prefix,
// removed when the test ends.
type fencedStores struct {
	pool   *pgxpool.Pool
	table  *sqlguard.Table
	txg    *sqlguard.Guard
	blobs  *blobguard.Guard
	prefix string // of the S3 keys
}

// fencedWrite names one of the three fenced write paths.
var fencedWrites = []string{"sqlguard.Table row", "sqlguard.Guard.BeginFunc", "blobguard object"}

func newFencedStores(t *testing.T) *fencedStores {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "fk_redis_failover_" + hex.EncodeToString(b[:])

	pool := migrationstest.New(t, schema).Pool
	for _, sql := range []string{
		`CREATE TABLE jobs (id text PRIMARY KEY, written_by text NOT NULL,
			lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`,
		`CREATE TABLE job_log (id text NOT NULL, written_by text NOT NULL, token bigint NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	f := &fencedStores{pool: pool, prefix: "redis-failover/" + hex.EncodeToString(b[:]) + "/"}
	var err error
	if f.table, err = sqlguard.NewTable(schema, "jobs", "id"); err != nil {
		t.Fatal(err)
	}
	if f.txg, err = sqlguard.New(sqlguard.WithSchema(schema)); err != nil {
		t.Fatal(err)
	}

	s3env := testenv.S3Config()
	if s3env.Endpoint == "" || s3env.AccessKey == "" || s3env.SecretKey == "" || s3env.Bucket == "" {
		t.Fatalf("this test needs an S3-compatible server: set %s, %s, %s and %s (./scripts/test.sh starts versitygw; or `. scripts/services.sh; ensure_s3`)",
			testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar, testenv.S3BucketVar)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	client := services.NewS3ClientOver(s3env, tr)
	if err := services.EnsureBucket(ctx, client, s3env.Bucket); err != nil {
		t.Fatalf("S3 bucket %s at %s: %v", s3env.Bucket, s3env.Endpoint, err)
	}
	if f.blobs, err = blobguard.New(client, s3env.Bucket); err != nil {
		t.Fatal(err)
	}
	if err := f.blobs.Check(ctx); err != nil {
		t.Fatalf("blobguard probe of %s: %v", s3env.Endpoint, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s3env.Bucket), Prefix: aws.String(f.prefix)})
		if err != nil {
			t.Logf("listing the test's S3 objects: %v", err)
			return
		}
		for _, o := range out.Contents {
			_, _ = client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s3env.Bucket), Key: o.Key})
		}
	})
	return f
}

// write writes as holder who with token to the resource res through each
// of the three fenced paths, and returns their errors in the order of
// fencedWrites.
func (f *fencedStores) write(ctx context.Context, res, who string, token fence.Token) []error {
	errs := make([]error, len(fencedWrites))
	errs[0] = f.table.Upsert(ctx, f.pool, []any{res}, token, sqlguard.Col("written_by", who))
	errs[1] = f.txg.BeginFunc(ctx, f.pool, "job:"+res, token, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO job_log (id, written_by, token) VALUES ($1, $2, $3)", res, who, int64(token))
		return err
	})
	_, errs[2] = f.blobs.Put(ctx, f.prefix+res, token, strings.NewReader(who))
	return errs
}

// writer returns who last wrote res through each fenced path, and the
// token it presented: the row's written_by and lock_version, the last
// accepted log entry, the object's body and token.
func (f *fencedStores) writer(t *testing.T, ctx context.Context, res string) []string {
	t.Helper()
	out := make([]string, len(fencedWrites))
	var who string
	var tok int64
	if err := f.pool.QueryRow(ctx, "SELECT written_by, lock_version FROM jobs WHERE id = $1", res).Scan(&who, &tok); err != nil {
		t.Fatalf("read row %s: %v", res, err)
	}
	out[0] = fmt.Sprintf("%s@%d", who, tok)
	if err := f.pool.QueryRow(ctx, "SELECT written_by, token FROM job_log WHERE id = $1 ORDER BY token DESC LIMIT 1", res).Scan(&who, &tok); err != nil {
		t.Fatalf("read log %s: %v", res, err)
	}
	out[1] = fmt.Sprintf("%s@%d", who, tok)
	obj, err := f.blobs.Get(ctx, f.prefix+res)
	if err != nil {
		t.Fatalf("read object %s: %v", res, err)
	}
	out[2] = fmt.Sprintf("%s@%d", obj.Body, obj.Version.Token())
	return out
}
