// Command zkholder is a lease holder process for zklease's paused-holder
// test (package consensus). It acquires one lease through lease.Manager over
// zklease, reports that the lease is valid, waits -write-delay (the window
// in which the test freezes it with SIGSTOP), then writes one row through
// sqlguard and one object through blobguard with its token, without checking
// the lease again, as a write already under way would. It reports each step
// as a JSON line on standard output (see event) and releases the lease.
//
// PostgreSQL and S3 come from FENCE_POSTGRES_URL and FENCE_S3_*.
//
// Exit status: 0 when it ran to the end (whatever the writes' outcome), 1
// on a failure, 2 on bad flags.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
	"github.com/fencekit/fencekit/sqlguard"
)

type event struct {
	At        time.Time     `json:"at"`
	Kind      string        `json:"kind"` // acquired, checked, write, released, failed
	Token     fence.Token   `json:"token,omitempty"`
	Remaining time.Duration `json:"remaining_ns,omitempty"`
	Store     string        `json:"store,omitempty"`
	Accepted  bool          `json:"accepted,omitempty"`
	Stale     bool          `json:"stale,omitempty"`
	Text      string        `json:"text,omitempty"`
}

var enc = json.NewEncoder(os.Stdout)

func emit(e event) {
	e.At = time.Now()
	_ = enc.Encode(e)
}

func main() { os.Exit(run()) }

func run() int {
	var (
		servers, root, name, schema, row, key string
		ttl, delay                            time.Duration
	)
	flag.StringVar(&servers, "servers", "", "ZooKeeper servers, comma-separated host:port (required)")
	flag.StringVar(&root, "root", zklease.DefaultRoot, "zklease root znode")
	flag.StringVar(&name, "name", "", "lease name (required)")
	flag.DurationVar(&ttl, "ttl", 2*time.Second, "lease TTL and session timeout")
	flag.DurationVar(&delay, "write-delay", time.Second, "time between checking the lease and writing")
	flag.StringVar(&schema, "schema", "", "PostgreSQL schema of the reports table (required)")
	flag.StringVar(&row, "row", "", "id of the row to write (required)")
	flag.StringVar(&key, "key", "", "S3 object key to write (required)")
	flag.Parse()
	if servers == "" || name == "" || schema == "" || row == "" || key == "" {
		fmt.Fprintln(os.Stderr, "zkholder: -servers, -name, -schema, -row and -key are required")
		return 2
	}
	fail := func(format string, args ...any) int {
		emit(event{Kind: "failed", Text: fmt.Sprintf(format, args...)})
		return 1
	}
	ctx := context.Background()
	b, err := zklease.New(strings.Split(servers, ","), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
	if err != nil {
		return fail("%v", err)
	}
	defer b.Close()
	m, err := lease.NewManager(b, ttl, lease.WithIdentity(fmt.Sprintf("zkholder-%d", os.Getpid())))
	if err != nil {
		return fail("%v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	l, err := m.Acquire(actx, name)
	cancel()
	if err != nil {
		return fail("acquire: %v", err)
	}
	tok := l.Token()
	emit(event{Kind: "acquired", Token: tok})

	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		return fail("postgres: %v", err)
	}
	defer pool.Close()
	table, err := sqlguard.NewTable(schema, "reports", "id")
	if err != nil {
		return fail("%v", err)
	}
	env := testenv.S3Config()
	guard, err := blobguard.New(s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(env.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(env.AccessKey, env.SecretKey, ""),
	}), env.Bucket)
	if err != nil {
		return fail("%v", err)
	}

	if err := l.Err(); err != nil {
		return fail("lease ended before the write: %v", err)
	}
	emit(event{Kind: "checked", Token: tok, Remaining: time.Until(l.Deadline())})
	time.Sleep(delay) // the test freezes the process in here

	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	report := func(store string, err error) {
		_, stale := fence.AsStale(err)
		text := "accepted"
		if err != nil {
			text = err.Error()
		}
		emit(event{Kind: "write", Store: store, Token: tok, Accepted: err == nil, Stale: stale, Text: text})
	}
	report("postgres", table.Update(wctx, pool, tok, []any{row}, sqlguard.Col("written_by", "A")))
	body, _ := json.Marshal(map[string]any{"written_by": "A", "token": tok})
	_, err = guard.Put(wctx, key, tok, strings.NewReader(string(body)))
	report("s3", err)
	err = l.Release(ctx)
	emit(event{Kind: "released", Token: tok, Text: fmt.Sprint(err)})
	return 0
}
