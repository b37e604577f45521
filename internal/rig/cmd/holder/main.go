// Command holder is the lease holder process of the integration tests: one
// program for every backend. It acquires one lease through lease.Manager
// over the backend that -store names, optionally writes with the lease's
// token to fenced stores, and reports each step as a JSON line on its
// standard output (package internal/rig/holder, Event).
//
//	-store redis             redislease (-redis, -prefix)
//	-store postgres          pglease, table mode (-postgres, -schema)
//	-store postgres-session  pglease, session mode (-postgres, -schema)
//	-store etcd              etcdlease (-endpoints, -prefix, -min-ttl)
//	-store zookeeper         zklease, session timeout -ttl (-servers, -root)
//	-store dynamodb          dynamolease (-leases; FENCE_DYNAMODB_ENDPOINT)
//
// What a write writes (each one set up before the lease is asked for, so
// that the lease's time is spent writing; several may be given):
//
//	-ledger SCHEMA -row K -object K   an Upsert of row K of SCHEMA.rows
//	                                  (sqlguard.Table), an insert into
//	                                  SCHEMA.ledger inside
//	                                  sqlguard.Guard.BeginFunc, and a Put of
//	                                  the S3 object K (blobguard): stores
//	                                  pg-row, pg-ledger and s3
//	-resource JSON                    the row and object of a
//	                                  guarded.Resource: postgres and s3
//	-dynamo-data TABLE -item K        a Put of item K (dynamoguard):
//	                                  dynamodb
//
// What it does once it holds the lease (-do):
//
//	release   releases it at once and exits (the default)
//	hold      keeps it, renewing, until it is lost or the process killed
//	commands  follows commands on standard input, one a line: "check"
//	          reports whether the lease is valid; "write" writes with the
//	          lease's token without checking it first (a holder paused
//	          between its check and its write, or one that never looks);
//	          "exit", or the end of the input, releases it and exits
//	rounds    makes -rounds rounds of writes, -interval apart; without
//	          -reckless it stops once its lease is lost, as a careful
//	          holder does (and can still write late when frozen between
//	          its check and its write); with it, it writes every round
//
// PostgreSQL and S3 come from FENCE_POSTGRES_URL and FENCE_S3_* (package
// internal/testkit/testenv). Exit status: 0 after a release, the end of
// its rounds or its commands; 1 when setup or Acquire failed, or a held
// lease (-do hold) was lost; 2 on bad flags.
package main

import (
	"bufio"
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
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/guarded"
	"github.com/fencekit/fencekit/internal/rig/holder"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/zklease"
	"github.com/fencekit/fencekit/sqlguard"
)

// flags are the command line.
type flags struct {
	store, name, role, do  string
	ttl, timeout           time.Duration
	redisURL, prefix       string
	pgURL, schema          string
	endpoints              string
	minTTL                 time.Duration
	servers, root          string
	leases                 string
	ledger, row, object    string
	resource               string
	dynamoData, item       string
	rounds                 int
	interval, writeTimeout time.Duration
	reckless               bool
}

func parseFlags() (flags, error) {
	var f flags
	flag.StringVar(&f.store, "store", "redis", "lease store: redis, postgres, postgres-session, etcd, zookeeper or dynamodb")
	flag.StringVar(&f.name, "name", "", "lease name, also the ledger Guard's resource (required)")
	flag.StringVar(&f.role, "role", "", "name in the output and the identity")
	flag.StringVar(&f.do, "do", "release", "once the lease is held: release, hold, commands or rounds")
	flag.DurationVar(&f.ttl, "ttl", time.Second, "lease TTL (and ZooKeeper session timeout)")
	flag.DurationVar(&f.timeout, "timeout", 30*time.Second, "how long to wait for the lease")
	flag.StringVar(&f.redisURL, "redis", testenv.RedisURL(), "Redis URL (-store redis)")
	flag.StringVar(&f.prefix, "prefix", "", "key prefix (-store redis, etcd; empty: the backend's default)")
	flag.StringVar(&f.pgURL, "postgres", testenv.PostgresURL(), "PostgreSQL URL (-store postgres*, -ledger, -resource)")
	flag.StringVar(&f.schema, "schema", "", "schema of pglease's tables (-store postgres*)")
	flag.StringVar(&f.endpoints, "endpoints", "", "etcd endpoints, comma-separated (-store etcd)")
	flag.DurationVar(&f.minTTL, "min-ttl", time.Second, "the etcd server's minimum TTL (-store etcd)")
	flag.StringVar(&f.servers, "servers", "", "ZooKeeper servers, comma-separated host:port (-store zookeeper)")
	flag.StringVar(&f.root, "root", zklease.DefaultRoot, "zklease root znode (-store zookeeper)")
	flag.StringVar(&f.leases, "leases", "", "lease table (-store dynamodb)")
	flag.StringVar(&f.ledger, "ledger", "", "PostgreSQL schema holding the rows, ledger and fencekit tables to write")
	flag.StringVar(&f.row, "row", "", "key of the row to upsert (-ledger)")
	flag.StringVar(&f.object, "object", "", "key of the S3 object to put (-ledger)")
	flag.StringVar(&f.resource, "resource", "", "a guarded.Resource to write, as JSON")
	flag.StringVar(&f.dynamoData, "dynamo-data", "", "DynamoDB table (string key pk) to write")
	flag.StringVar(&f.item, "item", "", "key of the DynamoDB item to put (-dynamo-data)")
	flag.IntVar(&f.rounds, "rounds", 5, "rounds of writes (-do rounds)")
	flag.DurationVar(&f.interval, "interval", 50*time.Millisecond, "pause between rounds of writes (-do rounds)")
	flag.DurationVar(&f.writeTimeout, "write-timeout", 20*time.Second, "how long one write may take")
	flag.BoolVar(&f.reckless, "reckless", false, "write every round even after the lease is lost (-do rounds)")
	flag.Parse()
	switch {
	case f.name == "":
		return f, errors.New("-name is required")
	case f.do != "release" && f.do != "hold" && f.do != "commands" && f.do != "rounds":
		return f, fmt.Errorf("-do %q: want release, hold, commands or rounds", f.do)
	case f.ledger != "" && (f.row == "" || f.object == ""):
		return f, errors.New("-ledger needs -row and -object")
	case f.dynamoData != "" && f.item == "":
		return f, errors.New("-dynamo-data needs -item")
	}
	return f, nil
}

type output struct {
	mu   sync.Mutex
	enc  *json.Encoder
	role string
}

func (o *output) emit(e holder.Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e.Pid, e.Role = os.Getpid(), o.role
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(e)
}

// observer reports renewals.
type observer struct {
	lease.NopObserver
	out *output
	l   func() *lease.Lease
}

func (ob observer) Renewed(e lease.RenewedEvent) {
	if e.Err != nil {
		ob.out.emit(holder.Event{Kind: holder.KindRenewFailed, Token: e.Token, Sent: e.Sent, Text: e.Err.Error()})
		return
	}
	ev := holder.Event{Kind: holder.KindRenewed, Token: e.Token, Sent: e.Sent}
	if l := ob.l(); l != nil {
		ev.Deadline = l.Deadline()
	}
	ob.out.emit(ev)
}

// closers are run, last first, when the program ends.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c closers) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// backend returns the lease backend -store names.
func backend(f flags, cl *closers) (lease.Backend, error) {
	switch f.store {
	case "redis":
		opt, err := redis.ParseURL(f.redisURL)
		if err != nil {
			return nil, fmt.Errorf("redis URL: %w", err)
		}
		opt.ContextTimeoutEnabled = true
		rc := redis.NewClient(opt)
		cl.add(func() { _ = rc.Close() })
		var opts []redislease.Option
		if f.prefix != "" {
			opts = append(opts, redislease.WithPrefix(f.prefix))
		}
		b, err := redislease.New(rc, opts...)
		if err != nil {
			return nil, err
		}
		cl.add(func() { _ = b.Close() })
		return b, nil
	case "postgres", "postgres-session":
		pool, err := pgxpool.New(context.Background(), f.pgURL)
		if err != nil {
			return nil, fmt.Errorf("postgres URL: %w", err)
		}
		cl.add(pool.Close)
		mode := pglease.ModeTable
		if f.store == "postgres-session" {
			mode = pglease.ModeSession
		}
		b, err := pglease.New(pool, pglease.WithMode(mode), pglease.WithSchema(f.schema))
		if err != nil {
			return nil, err
		}
		cl.add(func() { _ = b.Close() })
		return b, nil
	case "etcd":
		if f.endpoints == "" {
			return nil, errors.New("-store etcd needs -endpoints")
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(f.endpoints, ","), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcd client: %w", err)
		}
		cl.add(func() { _ = cli.Close() })
		opts := []etcdlease.Option{etcdlease.WithMinTTL(f.minTTL)}
		if f.prefix != "" {
			opts = append(opts, etcdlease.WithPrefix(f.prefix))
		}
		b, err := etcdlease.New(cli, opts...)
		if err != nil {
			return nil, err
		}
		cl.add(func() { _ = b.Close() })
		return b, nil
	case "zookeeper":
		if f.servers == "" {
			return nil, errors.New("-store zookeeper needs -servers")
		}
		b, err := zklease.New(strings.Split(f.servers, ","), zklease.WithRoot(f.root), zklease.WithSessionTimeout(f.ttl))
		if err != nil {
			return nil, err
		}
		cl.add(func() { _ = b.Close() })
		return b, nil
	case "dynamodb":
		if f.leases == "" {
			return nil, errors.New("-store dynamodb needs -leases")
		}
		ep, err := dynamotest.Endpoint()
		if err != nil {
			return nil, err
		}
		return dynamolease.New(dynamotest.NewClient(ep, nil), f.leases)
	}
	return nil, fmt.Errorf("-store %q: want redis, postgres, postgres-session, etcd, zookeeper or dynamodb", f.store)
}

// write is one fenced write with the lease's token; value names the round.
type write struct {
	store string
	do    func(ctx context.Context, tok fence.Token, value string) error
}

// writes sets up the fenced stores the flags name.
func writes(ctx context.Context, f flags, cl *closers) ([]write, error) {
	var ws []write
	if f.ledger != "" || f.resource != "" {
		// S3 first: it is the one most often missing from the environment.
		env := testenv.S3Config()
		if env.Endpoint == "" || env.AccessKey == "" || env.SecretKey == "" || env.Bucket == "" {
			return nil, fmt.Errorf("%s, %s, %s and %s must be set", testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar, testenv.S3BucketVar)
		}
	}
	if f.ledger != "" {
		pcfg, err := pgx.ParseConfig(f.pgURL)
		if err != nil {
			return nil, fmt.Errorf("-postgres: %w", err)
		}
		pcfg.RuntimeParams["search_path"] = f.ledger
		conn, err := pgx.ConnectConfig(ctx, pcfg)
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL: %w", err)
		}
		cl.add(func() { _ = conn.Close(context.Background()) })
		table, err := sqlguard.NewTable("", "rows", "k")
		if err != nil {
			return nil, err
		}
		guard, err := sqlguard.New()
		if err != nil {
			return nil, err
		}
		env := testenv.S3Config()
		blobs, err := blobguard.New(s3.New(s3.Options{
			Region: "us-east-1", BaseEndpoint: aws.String(env.Endpoint), UsePathStyle: true,
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: env.AccessKey, SecretAccessKey: env.SecretKey}, nil
			}),
			HTTPClient: &http.Client{Transport: http.DefaultTransport},
		}), env.Bucket)
		if err != nil {
			return nil, err
		}
		if err := blobs.Check(ctx); err != nil {
			return nil, fmt.Errorf("S3 probe: %w", err)
		}
		ws = append(ws,
			write{"pg-row", func(ctx context.Context, tok fence.Token, value string) error {
				return table.Upsert(ctx, conn, []any{f.row}, tok, sqlguard.Col("v", value))
			}},
			write{"pg-ledger", func(ctx context.Context, tok fence.Token, value string) error {
				return guard.BeginFunc(ctx, conn, f.name, tok, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "INSERT INTO ledger (resource, token, writer) VALUES ($1, $2, $3)", f.name, int64(tok), value)
					return err
				})
			}},
			write{"s3", func(ctx context.Context, tok fence.Token, value string) error {
				_, err := blobs.Put(ctx, f.object, tok, strings.NewReader(value))
				return err
			}})
	}
	if f.resource != "" {
		var r guarded.Resource
		if err := json.Unmarshal([]byte(f.resource), &r); err != nil {
			return nil, fmt.Errorf("-resource: %w", err)
		}
		// The writer's name in the resource is the role (A by default).
		who := f.role
		if who == "" {
			who = "A"
		}
		ws = append(ws,
			write{"postgres", func(ctx context.Context, tok fence.Token, _ string) error { return guarded.WriteRow(ctx, r, who, tok) }},
			write{"s3", func(ctx context.Context, tok fence.Token, _ string) error {
				return guarded.WriteObject(ctx, r, who, tok)
			}})
	}
	if f.dynamoData != "" {
		ep, err := dynamotest.Endpoint()
		if err != nil {
			return nil, err
		}
		g, err := dynamoguard.New(dynamotest.NewClient(ep, nil), f.dynamoData)
		if err != nil {
			return nil, err
		}
		ws = append(ws, write{"dynamodb", func(ctx context.Context, tok fence.Token, _ string) error {
			return g.Put(ctx, map[string]types.AttributeValue{
				"pk":    &types.AttributeValueMemberS{Value: f.item},
				"value": &types.AttributeValueMemberS{Value: fmt.Sprintf("holder %d", tok)},
			}, tok)
		}})
	}
	return ws, nil
}

// writeAll makes one round of writes and reports each.
func writeAll(out *output, ws []write, timeout time.Duration, tok fence.Token, round int, value string) {
	for _, w := range ws {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		err := w.do(ctx, tok, value)
		cancel()
		e := holder.Event{Kind: holder.KindWrite, Token: tok, Store: w.store, Round: round, Start: start, End: time.Now(), Value: value, Outcome: holder.Accepted}
		var se *fence.StaleError
		switch {
		case err == nil:
		case errors.Is(err, fence.ErrOutcomeUnknown):
			e.Outcome, e.Text = holder.Unknown, err.Error()
		case errors.As(err, &se):
			e.Outcome, e.Current, e.Text = holder.Stale, se.Current, err.Error()
		case errors.Is(err, fence.ErrStaleToken):
			e.Outcome, e.Text = holder.Stale, err.Error()
		default:
			e.Outcome, e.Text = holder.Error, err.Error()
		}
		out.emit(e)
	}
}

func main() { os.Exit(run()) }

func run() int {
	f, err := parseFlags()
	if err != nil {
		fmt.Fprintf(os.Stderr, "holder: %v\n", err)
		return 2
	}
	out := &output{enc: json.NewEncoder(os.Stdout), role: f.role}
	fail := func(format string, args ...any) int {
		out.emit(holder.Event{Kind: holder.KindFailed, Text: fmt.Sprintf(format, args...)})
		return 1
	}
	var cl closers
	defer cl.run()
	ctx := context.Background()
	ws, err := writes(ctx, f, &cl)
	if err != nil {
		return fail("%v", err)
	}
	b, err := backend(f, &cl)
	if err != nil {
		return fail("%v", err)
	}
	var (
		mu  sync.Mutex
		cur *lease.Lease
	)
	ob := observer{out: out, l: func() *lease.Lease { mu.Lock(); defer mu.Unlock(); return cur }}
	id := fmt.Sprintf("holder-%d", os.Getpid())
	if f.role != "" {
		id = fmt.Sprintf("holder-%s-%d", f.role, os.Getpid())
	}
	opts := []lease.Option{lease.WithIdentity(id)}
	if f.do != "rounds" {
		// Rounds report their writes alone: the reliability suite reads
		// a write history, not a renewal log.
		opts = append(opts, lease.WithObserver(ob))
	}
	m, err := lease.NewManager(b, f.ttl, opts...)
	if err != nil {
		return fail("%v", err)
	}
	out.emit(holder.Event{Kind: holder.KindWaiting, Text: "waiting for " + f.name})
	actx, cancel := context.WithTimeout(ctx, f.timeout)
	l, err := m.Acquire(actx, f.name)
	cancel()
	if err != nil {
		return fail("acquire: %v", err)
	}
	mu.Lock()
	cur = l
	mu.Unlock()
	tok := l.Token()
	out.emit(holder.Event{Kind: holder.KindAcquired, Token: tok, Sent: l.Deadline().Add(-(l.TTL() - m.Options().SafetyMargin)), Deadline: l.Deadline()})
	release := func() int {
		err := l.Release(ctx)
		if err != nil && f.do == "release" {
			return fail("release: %v", err)
		}
		e := holder.Event{Kind: holder.KindReleased, Token: tok}
		if err != nil {
			e.Text = err.Error()
		}
		out.emit(e)
		return 0
	}
	switch f.do {
	case "hold":
		<-l.Done()
		out.emit(holder.Event{Kind: holder.KindLost, Token: tok, Text: fmt.Sprint(l.Err())})
		return 1
	case "rounds":
		for round := range f.rounds {
			if !f.reckless && l.Err() != nil {
				out.emit(holder.Event{Kind: holder.KindLost, Token: tok, Text: l.Err().Error()})
				return 0
			}
			writeAll(out, ws, f.writeTimeout, tok, round, fmt.Sprintf("%s:%d:%d", f.role, tok, round))
			time.Sleep(f.interval)
		}
		if err := l.Release(ctx); err != nil {
			out.emit(holder.Event{Kind: holder.KindLost, Token: tok, Text: err.Error()})
			return 0
		}
		out.emit(holder.Event{Kind: holder.KindReleased, Token: tok})
		return 0
	case "commands":
		go func() {
			<-l.Done()
			if err := l.Err(); err != nil && !errors.Is(err, lease.ErrReleased) {
				out.emit(holder.Event{Kind: holder.KindLost, Token: tok, Text: err.Error()})
			}
		}()
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			switch cmd := strings.TrimSpace(in.Text()); cmd {
			case "check":
				err := l.Err()
				e := holder.Event{Kind: holder.KindChecked, Token: tok, Valid: err == nil, Deadline: l.Deadline()}
				if err != nil {
					e.Text = err.Error()
				}
				out.emit(e)
			case "write":
				writeAll(out, ws, f.writeTimeout, tok, 0, fmt.Sprintf("%s:%d", f.role, tok))
			case "exit":
				return release()
			default:
				out.emit(holder.Event{Kind: holder.KindFailed, Text: "unknown command " + cmd})
			}
		}
	}
	return release()
}
