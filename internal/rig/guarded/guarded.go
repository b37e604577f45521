// Package guarded is the fenced resource the integration tests' holders
// write to: one row of a PostgreSQL table with lock_version (sqlguard) and
// one S3 object (blobguard), both written with a lease's token, so that a
// holder whose lease was taken over is rejected at both stores. The test
// process and the holder program (internal/rig/cmd/holder, -resource) share it.
//
// Services come from FENCE_POSTGRES_URL and FENCE_S3_* (./scripts/test.sh
// exports them; see package internal/testkit/testenv).
package guarded

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/sqlguard"
)

// Resource names one fenced row and one fenced object.
type Resource struct {
	Schema string `json:"schema"`
	Row    string `json:"row"`
	Object string `json:"object"`
}

// Table is the name of the fenced table in Resource.Schema.
const Table = "jobs"

// Create makes a new schema with the fenced table and its row, and returns
// the resource and a function that drops it and deletes the object.
func Create(ctx context.Context) (Resource, func(context.Context), error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := Resource{Schema: "guarded_" + hex.EncodeToString(b[:]), Row: "job-1", Object: "guarded/" + hex.EncodeToString(b[:])}
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		return r, nil, fmt.Errorf("PostgreSQL at %s: %w", testenv.PostgresURL(), err)
	}
	defer conn.Close(ctx)
	schema := pgx.Identifier{r.Schema}.Sanitize()
	for _, q := range []string{
		"CREATE SCHEMA " + schema,
		"CREATE TABLE " + schema + "." + Table + " (id text PRIMARY KEY, written_by text NOT NULL, lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return r, nil, fmt.Errorf("%s: %w", q, err)
		}
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+schema+"."+Table+" (id, written_by) VALUES ($1, '')", r.Row); err != nil {
		return r, nil, err
	}
	drop := func(ctx context.Context) {
		if c, err := pgx.Connect(ctx, testenv.PostgresURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
		if c, env, err := S3(); err == nil {
			_, _ = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(env.Bucket), Key: aws.String(r.Object)})
		}
	}
	return r, drop, nil
}

// S3 returns a client of the S3-compatible store in FENCE_S3_*.
func S3() (*s3.Client, testenv.S3, error) {
	env := testenv.S3Config()
	if env.Endpoint == "" || env.AccessKey == "" || env.SecretKey == "" || env.Bucket == "" {
		return nil, env, fmt.Errorf("%s, %s, %s and %s must be set: run the tests through ./scripts/test.sh (or source scripts/services.sh and call ensure_s3)",
			testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar, testenv.S3BucketVar)
	}
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(env.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(env.AccessKey, env.SecretKey, ""),
	}), env, nil
}

// Outcome is what one fenced write did.
type Outcome struct {
	Store    string `json:"store"` // "postgres" or "s3"
	Accepted bool   `json:"accepted"`
	Stale    bool   `json:"stale"` // rejected with fence.ErrStaleToken
	Err      string `json:"err,omitempty"`
}

// Write writes the row (sqlguard Table.Update) and the object (blobguard
// Put) as writer, with token, and reports both outcomes.
func Write(ctx context.Context, r Resource, writer string, token fence.Token) []Outcome {
	return []Outcome{outcome("postgres", WriteRow(ctx, r, writer, token)), outcome("s3", WriteObject(ctx, r, writer, token))}
}

func outcome(store string, err error) Outcome {
	o := Outcome{Store: store, Accepted: err == nil, Stale: errors.Is(err, fence.ErrStaleToken)}
	if err != nil {
		o.Err = err.Error()
	}
	return o
}

// WriteRow updates the row (sqlguard Table.Update) as writer, with token.
func WriteRow(ctx context.Context, r Resource, writer string, token fence.Token) error {
	t, err := sqlguard.NewTable(r.Schema, Table, "id")
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return t.Update(ctx, conn, []any{r.Row}, token, sqlguard.Col("written_by", writer))
}

// WriteObject puts the object (blobguard Put) as writer, with token.
func WriteObject(ctx context.Context, r Resource, writer string, token fence.Token) error {
	c, env, err := S3()
	if err != nil {
		return err
	}
	g, err := blobguard.New(c, env.Bucket)
	if err != nil {
		return err
	}
	_, err = g.Put(ctx, r.Object, token, bytes.NewReader([]byte(writer)))
	return err
}

// Stored reads who wrote the row and the object last, and with which token.
func Stored(ctx context.Context, r Resource) (rowBy string, rowToken fence.Token, objBy string, objToken fence.Token, err error) {
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		return "", 0, "", 0, err
	}
	defer conn.Close(ctx)
	var v int64
	if err := conn.QueryRow(ctx, "SELECT written_by, lock_version FROM "+pgx.Identifier{r.Schema, Table}.Sanitize()+" WHERE id = $1", r.Row).Scan(&rowBy, &v); err != nil {
		return "", 0, "", 0, err
	}
	c, env, err := S3()
	if err != nil {
		return "", 0, "", 0, err
	}
	g, err := blobguard.New(c, env.Bucket)
	if err != nil {
		return "", 0, "", 0, err
	}
	obj, err := g.Get(ctx, r.Object)
	if err != nil {
		return "", 0, "", 0, err
	}
	return rowBy, fence.Token(v), string(obj.Body), obj.Token(), nil
}
