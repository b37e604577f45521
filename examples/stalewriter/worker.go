package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/sqlguard"
)

// workerConfig is what the orchestrator hands a worker process (as JSON in
// the environment variable configVar, see demo.StartChild).
type workerConfig struct {
	demo.ChildLease            // the lease, where it lives, its TTL
	Role            string     `json:"role"`
	S3              testenv.S3 `json:"s3"`
	Table           string     `json:"table"`
	RowID           string     `json:"row_id"`
	ObjectKey       string     `json:"object_key"`
	Resource        string     `json:"resource"`
	// WriteDelay is the time between checking the lease and writing: the
	// window in which the orchestrator freezes worker A.
	WriteDelay time.Duration `json:"write_delay"`
	Unguarded  bool          `json:"unguarded"`
	// Dynamo is the DynamoDB item the workers also write (--dynamodb).
	Dynamo *dynamoTarget `json:"dynamodb,omitempty"`
	// RowStore is where the row lives (--row-store: "" or postgres,
	// mariadb, sqlite) and RowDSN its database/sql DSN (not postgres).
	RowStore string `json:"row_store,omitempty"`
	RowDSN   string `json:"row_dsn,omitempty"`
}

const configVar = "FENCEKIT_STALEWRITER_WORKER"

// event is one line a worker prints on its standard output.
type event struct {
	At    time.Time   `json:"at"`
	Role  string      `json:"role"`
	Kind  string      `json:"kind"`
	Token fence.Token `json:"token,omitempty"`
	// Store is "postgres" (or the --row-store), "s3" or "dynamodb" for
	// write events.
	Store string `json:"store,omitempty"`
	// Accepted is set on write events the store accepted.
	Accepted bool `json:"accepted,omitempty"`
	// Outcome is, on write events, the store's answer: outcomeAccepted,
	// outcomeStale or outcomeFailed (see verdict.go).
	Outcome string `json:"outcome,omitempty"`
	// Current is, on a write rejected as stale, the newer token the store
	// had accepted.
	Current fence.Token `json:"current,omitempty"`
	// Error is, on a failed write, the error.
	Error string `json:"error,omitempty"`
	// Sent is, on write events, when the write was sent; At is when the
	// answer came.
	Sent time.Time `json:"sent,omitzero"`
	// Deadline is, on write events, the writer's local lease deadline as
	// it stood when the write was sent (Lease.Deadline).
	Deadline time.Time `json:"lease_deadline,omitzero"`
	// Remaining is, on the checked event, the time left until the lease's
	// local deadline.
	Remaining time.Duration `json:"remaining_ns,omitempty"`
	Text      string        `json:"text"`
}

const (
	evAcquired   = "acquired"
	evChecked    = "checked" // the lease was valid just now; the write follows after WriteDelay
	evWrite      = "write"
	evLeaseState = "lease"
	evLost       = "lost" // the worker's lease ended without a release
	evReleased   = "released"
	evFailed     = "failed"
)

// Events the orchestrator adds to the workers' (Role "orchestrator").
const (
	evFroze   = "froze"   // worker A was frozen with SIGSTOP
	evResumed = "resumed" // worker A was resumed with SIGCONT
)

type worker struct {
	cfg workerConfig
	out *demo.Reporter // the loss watcher emits too
}

func (w *worker) emit(e event) {
	e.At, e.Role = time.Now(), w.cfg.Role
	w.out.Report(e)
}

// watchLoss reports the moment this process notices that l ended without
// a release (a frozen process notices only once it runs again). The
// returned function waits for the watcher to finish after the release.
func (w *worker) watchLoss(l *lease.Lease) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-l.Done()
		if err := l.Err(); errors.Is(err, lease.ErrLost) {
			w.emit(event{Kind: evLost, Token: l.Token(), Text: fmt.Sprintf("noticed its lease is lost: %v", err)})
		}
	}()
	return func() { <-done }
}

func (w *worker) fail(format string, args ...any) int {
	w.emit(event{Kind: evFailed, Text: fmt.Sprintf(format, args...)})
	return 1
}

// runWorker is the body of a worker process: acquire the lease, check it,
// write the row and the object with its token, release.
func runWorker() int {
	w := &worker{out: demo.NewReporter(os.Stdout)}
	if err := demo.ReadChildConfig(configVar, &w.cfg); err != nil {
		fmt.Fprintf(os.Stderr, "stalewriter worker: %v\n", err)
		return 2
	}
	cfg := w.cfg
	ctx := context.Background()

	m, closeLeases, err := demo.NewLeaseManager(cfg.Leases(), cfg.TTL, lease.WithIdentity("worker-"+cfg.Role))
	if err != nil {
		return w.fail("%v", err)
	}
	defer closeLeases()
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return w.fail("postgres: %v", err)
	}
	defer pool.Close()
	s3c := services.NewS3Client(cfg.S3)

	actx, cancel := context.WithTimeout(ctx, cfg.AcquireTimeout)
	l, err := m.Acquire(actx, cfg.LeaseName)
	cancel()
	if err != nil {
		return w.fail("could not acquire lease %s: %v", cfg.LeaseName, err)
	}
	tok := l.Token()
	w.emit(event{Kind: evAcquired, Token: tok, Text: fmt.Sprintf("acquired lease %q with fencing token %d (TTL %v)", cfg.LeaseName, tok, cfg.TTL)})
	waitWatcher := w.watchLoss(l)

	if err := l.Err(); err != nil {
		return w.fail("lease ended before the write: %v", err)
	}
	remaining := time.Until(l.Deadline())
	w.emit(event{Kind: evChecked, Token: tok, Remaining: remaining, Text: fmt.Sprintf("lease is valid (local deadline in %v); writing the report now", remaining.Round(time.Millisecond))})
	time.Sleep(cfg.WriteDelay) // preparing the write: A is frozen in here

	// The write does not re-check the lease: it was valid a moment ago, as
	// far as this process can tell. (A paused process cannot tell.) It uses
	// its own context, not the lease's, the way a write already under way
	// would.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	note := fmt.Sprintf("written by %s with token %d at %s", cfg.Role, tok, time.Now().UTC().Format(time.RFC3339Nano))
	w.writeRow(wctx, pool, l, note)
	w.writeObject(wctx, s3c, l, note)
	w.writeDownstream(wctx, l, note)
	if cfg.Dynamo != nil {
		w.writeItem(wctx, l, note)
	}

	if err := l.Err(); err != nil {
		w.emit(event{Kind: evLeaseState, Token: tok, Text: fmt.Sprintf("lease state after the writes: %v", err)})
	} else {
		w.emit(event{Kind: evLeaseState, Token: tok, Text: fmt.Sprintf("lease still held (local deadline in %v)", time.Until(l.Deadline()).Round(time.Millisecond))})
	}
	err = l.Release(ctx)
	waitWatcher()
	switch {
	case err == nil:
		w.emit(event{Kind: evReleased, Token: tok, Text: "released the lease"})
	case errors.Is(err, lease.ErrLost):
		w.emit(event{Kind: evReleased, Token: tok, Text: "release reports the lease was lost: " + err.Error()})
	default:
		w.emit(event{Kind: evReleased, Token: tok, Text: "release failed: " + err.Error()})
	}
	return 0
}

func (w *worker) writeRow(ctx context.Context, pool *pgxpool.Pool, l *lease.Lease, note string) {
	cfg := w.cfg
	tok, sent, deadline := l.Token(), time.Now(), l.Deadline()
	var err error
	if cfg.rowStoreName() != rowPostgres {
		err = writeRowDB(ctx, cfg, tok, note)
		w.reportWrite(event{Store: cfg.rowStoreName(), Token: tok, Sent: sent, Deadline: deadline}, err, fmt.Sprintf("row report id=%s", cfg.RowID))
		return
	}
	if cfg.Unguarded {
		_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET written_by = $1, token = $2, note = $3 WHERE id = $4`,
			pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()), cfg.Role, int64(tok), note, cfg.RowID)
	} else {
		err = writeRowFenced(ctx, pool, cfg, tok, note)
	}
	w.reportWrite(event{Store: "postgres", Token: tok, Sent: sent, Deadline: deadline}, err, fmt.Sprintf("row %s.%s id=%s", cfg.Schema, cfg.Table, cfg.RowID))
}

// writeRowFenced is the guarded write: a fenced transaction on the resource
// (the token row is advanced and locked first) with a fenced row update
// (lock_version <= token) inside it.
func writeRowFenced(ctx context.Context, pool *pgxpool.Pool, cfg workerConfig, tok fence.Token, note string) error {
	guard, err := sqlguard.New(sqlguard.WithSchema(cfg.Schema))
	if err != nil {
		return err
	}
	table, err := sqlguard.NewTable(cfg.Schema, cfg.Table, "id")
	if err != nil {
		return err
	}
	return guard.BeginFunc(ctx, pool, cfg.Resource, tok, func(tx pgx.Tx) error {
		return table.Update(ctx, tx, []any{cfg.RowID}, tok,
			sqlguard.Col("written_by", cfg.Role), sqlguard.Col("token", int64(tok)), sqlguard.Col("note", note))
	})
}

func (w *worker) writeObject(ctx context.Context, c *s3.Client, l *lease.Lease, note string) {
	cfg := w.cfg
	tok, sent, deadline := l.Token(), time.Now(), l.Deadline()
	body, _ := json.Marshal(objectBody{WrittenBy: cfg.Role, Token: tok, Note: note})
	var err error
	if cfg.Unguarded {
		_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(cfg.S3.Bucket), Key: aws.String(cfg.ObjectKey), Body: strings.NewReader(string(body))})
	} else {
		var g *blobguard.Guard
		if g, err = blobguard.New(c, cfg.S3.Bucket); err == nil {
			_, err = g.Put(ctx, cfg.ObjectKey, tok, strings.NewReader(string(body)))
		}
	}
	w.reportWrite(event{Store: "s3", Token: tok, Sent: sent, Deadline: deadline}, err, fmt.Sprintf("object s3://%s/%s", cfg.S3.Bucket, cfg.ObjectKey))
}

// reportWrite emits the write event e (Store, Token, Sent and Deadline
// set) with the store's answer err.
func (w *worker) reportWrite(e event, err error, what string) {
	e.Kind = evWrite
	switch se, stale := fence.AsStale(err); {
	case err == nil:
		e.Accepted, e.Outcome = true, outcomeAccepted
		e.Text = fmt.Sprintf("%s: wrote %s with token %d: accepted", e.Store, what, e.Token)
	case stale:
		e.Outcome, e.Current = outcomeStale, se.Current
		e.Text = fmt.Sprintf("%s: REJECTED write of %s: stale token %d, the store has already accepted token %d", e.Store, what, se.Presented, se.Current)
	default:
		e.Outcome, e.Error = outcomeFailed, err.Error()
		e.Text = fmt.Sprintf("%s: write of %s failed: %v", e.Store, what, err)
	}
	w.emit(e)
}

// objectBody is what the workers store in S3.
type objectBody struct {
	WrittenBy string      `json:"written_by"`
	Token     fence.Token `json:"token"`
	Note      string      `json:"note"`
}
