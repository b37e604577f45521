// Command pausedwriter is a lease holder that writes, for the reliability
// suite's paused-holder trials (integration/reliability). It acquires one
// lease through lease.Manager over redislease, then makes -writes rounds of
// fenced writes with the lease's token, -interval apart: an Upsert of one
// row through sqlguard.Table, an insert into a ledger inside
// sqlguard.Guard.BeginFunc, and a Put of one object through blobguard. It
// reports every step as a JSON line on standard output (see Event).
//
// With -reckless it writes every round whatever happens to its lease (the
// worst holder: one that never looks); without it, it stops writing once
// its lease is lost, as a careful holder does, and can still write late
// when it was frozen between its check and its write.
//
// PostgreSQL and S3 come from FENCE_POSTGRES_URL and FENCE_S3_*. Exit
// status: 0 after its rounds, 1 on a failure to set up or acquire, 2 on
// bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/sqlguard"
)

// Event is one line of output. Times are Unix nanoseconds of the wall
// clock, which all processes of a trial share.
type Event struct {
	At    int64       `json:"at"`
	Role  string      `json:"role"`
	Kind  string      `json:"kind"` // ready, acquired, write, lost, released, failed
	Token fence.Token `json:"token,omitempty"`
	// For writes: which store, which round, when the call started and
	// ended, and its outcome: accepted, stale, unknown or error.
	Store   string `json:"store,omitempty"`
	Round   int    `json:"round,omitempty"`
	Start   int64  `json:"start,omitempty"`
	End     int64  `json:"end,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Value   string `json:"value,omitempty"`
	Text    string `json:"text,omitempty"`
}

type output struct {
	mu   sync.Mutex
	enc  *json.Encoder
	role string
}

func (o *output) emit(e Event) {
	if e.At == 0 {
		e.At = time.Now().UnixNano()
	}
	e.Role = o.role
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(e)
}

func main() { os.Exit(run()) }

func run() int {
	var (
		redisURL, prefix, name, role, schema, rowKey, objKey string
		ttl, interval, wait                                  time.Duration
		writes                                               int
		reckless                                             bool
	)
	flag.StringVar(&redisURL, "redis", testenv.RedisURL(), "Redis URL")
	flag.StringVar(&prefix, "prefix", "fencekit:", "redislease key prefix")
	flag.StringVar(&name, "name", "", "lease name, also the Guard's resource (required)")
	flag.StringVar(&role, "role", "", "name in the output (required)")
	flag.StringVar(&schema, "schema", "", "PostgreSQL schema holding the rows, ledger and fencekit tables (required)")
	flag.StringVar(&rowKey, "row", "", "key of the row to upsert (required)")
	flag.StringVar(&objKey, "object", "", "key of the object to put (required)")
	flag.DurationVar(&ttl, "ttl", 200*time.Millisecond, "lease TTL")
	flag.DurationVar(&interval, "interval", 50*time.Millisecond, "pause between rounds of writes")
	flag.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the lease")
	flag.IntVar(&writes, "writes", 5, "rounds of writes")
	flag.BoolVar(&reckless, "reckless", false, "write every round even after the lease is lost")
	flag.Parse()
	out := &output{enc: json.NewEncoder(os.Stdout), role: role}
	fail := func(format string, args ...any) int {
		out.emit(Event{Kind: "failed", Text: fmt.Sprintf(format, args...)})
		return 1
	}
	if name == "" || role == "" || schema == "" || rowKey == "" || objKey == "" {
		fmt.Fprintln(os.Stderr, "pausedwriter: -name, -role, -schema, -row and -object are required")
		return 2
	}
	ctx := context.Background()

	// The stores first, so that the lease's time is spent writing.
	pcfg, err := pgx.ParseConfig(testenv.PostgresURL())
	if err != nil {
		return fail("%s: %v", testenv.PostgresURLVar, err)
	}
	pcfg.RuntimeParams["search_path"] = schema
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		return fail("PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	table, err := sqlguard.NewTable("", "rows", "k")
	if err != nil {
		return fail("%v", err)
	}
	guard, err := sqlguard.New()
	if err != nil {
		return fail("%v", err)
	}
	env := testenv.S3Config()
	s3c := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(env.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: env.AccessKey, SecretAccessKey: env.SecretKey}, nil
		}),
		HTTPClient: &http.Client{Transport: http.DefaultTransport},
	})
	blobs, err := blobguard.New(s3c, env.Bucket)
	if err != nil {
		return fail("%v", err)
	}
	if err := blobs.Probe(ctx); err != nil {
		return fail("S3 probe: %v", err)
	}

	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return fail("redis URL: %v", err)
	}
	opt.ContextTimeoutEnabled = true
	rc := redis.NewClient(opt)
	defer rc.Close()
	backend, err := redislease.New(rc, redislease.WithPrefix(prefix))
	if err != nil {
		return fail("%v", err)
	}
	defer backend.Close()
	m, err := lease.NewManager(backend, ttl, lease.WithIdentity(fmt.Sprintf("pausedwriter-%s-%d", role, os.Getpid())))
	if err != nil {
		return fail("%v", err)
	}
	out.emit(Event{Kind: "ready"})
	actx, cancel := context.WithTimeout(ctx, wait)
	l, err := m.Acquire(actx, name)
	cancel()
	if err != nil {
		return fail("acquire: %v", err)
	}
	tok := l.Token()
	out.emit(Event{Kind: "acquired", Token: tok})

	for round := range writes {
		if !reckless && l.Err() != nil {
			out.emit(Event{Kind: "lost", Token: tok, Text: l.Err().Error()})
			return 0
		}
		value := fmt.Sprintf("%s:%d:%d", role, tok, round)
		write := func(store string, do func(context.Context) error) {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			start := time.Now().UnixNano()
			err := do(wctx)
			e := Event{Kind: "write", Token: tok, Store: store, Round: round, Start: start, End: time.Now().UnixNano(), Value: value, Outcome: "accepted"}
			switch {
			case err == nil:
			case errors.Is(err, fence.ErrOutcomeUnknown):
				e.Outcome, e.Text = "unknown", err.Error()
			case errors.Is(err, fence.ErrStaleToken):
				e.Outcome, e.Text = "stale", err.Error()
			default:
				e.Outcome, e.Text = "error", err.Error()
			}
			out.emit(e)
		}
		write("pg-row", func(ctx context.Context) error {
			return table.Upsert(ctx, conn, tok, []any{rowKey}, sqlguard.Col("v", value))
		})
		write("pg-ledger", func(ctx context.Context) error {
			return guard.BeginFunc(ctx, conn, name, tok, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO ledger (resource, token, writer) VALUES ($1, $2, $3)", name, int64(tok), value)
				return err
			})
		})
		write("s3", func(ctx context.Context) error {
			_, err := blobs.Put(ctx, objKey, tok, strings.NewReader(value))
			return err
		})
		time.Sleep(interval)
	}
	if err := l.Release(ctx); err != nil {
		out.emit(Event{Kind: "lost", Token: tok, Text: err.Error()})
		return 0
	}
	out.emit(Event{Kind: "released", Token: tok})
	return 0
}
