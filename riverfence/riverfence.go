package riverfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/rowguard"
	"github.com/fencekit/fencekit/sqlguard"
)

// DB is what a Fence needs of the database River works in: statements and
// transactions. *pgxpool.Pool has both; pass the pool River's driver uses
// (riverpgxv5.New(pool)).
type DB interface {
	sqlguard.DBTX
	sqlguard.Beginner
}

// MetadataKey is the key of the job's metadata under which the middleware
// tags each attempt's report with the attempt's identity: {"attempt": the
// attempt's number, "at": its attempted_at in microseconds since the Unix
// epoch, "token": its fencing token}. River merges it into the row when
// the attempt's outcome is recorded; the trigger Install creates reads it.
const MetadataKey = "fencekit_attempt"

// Defaults of Options.
const (
	// DefaultPrefix starts the resource names of jobs (Resource).
	DefaultPrefix = "river/job/"
	// DefaultWatchInterval is how often a running attempt reads its job's
	// row to learn whether it was superseded.
	DefaultWatchInterval = time.Second
	// MinWatchInterval is the shortest WatchInterval accepted.
	MinWatchInterval = 10 * time.Millisecond
)

// Options configure a Fence. The zero value is valid.
type Options struct {
	// Schema is the schema of fencekit's tables (fencekit_resource_tokens
	// and fencekit_advance_token, created by `fencekit migrate up`).
	// Default "": found through the connection's search_path.
	Schema string

	// RiverSchema is River's schema, as in river.Config.Schema. Default
	// "": found through the connection's search_path.
	RiverSchema string

	// Prefix starts the name of each job's resource: Prefix + the job's
	// id. Default DefaultPrefix, or "river/<RiverSchema>/job/" when
	// RiverSchema is set, so that the jobs of two River schemas never
	// share a resource. Two Fences over different River databases that
	// share one fencekit table need prefixes of their own.
	Prefix string

	// WatchInterval is how often a running attempt reads its job's row (one
	// statement) to learn whether it was superseded, and then ends its
	// context. Default DefaultWatchInterval; at least MinWatchInterval.
	WatchInterval time.Duration

	// Observer receives a fence.WriteEvent for the advance of every
	// Complete and CompleteTx (sqlguard's Guard events). Default: none.
	Observer fence.WriteObserver
}

// Option changes Options.
type Option func(*Options)

// WithSchema sets Options.Schema.
func WithSchema(schema string) Option { return func(o *Options) { o.Schema = schema } }

// WithRiverSchema sets Options.RiverSchema.
func WithRiverSchema(schema string) Option { return func(o *Options) { o.RiverSchema = schema } }

// WithPrefix sets Options.Prefix.
func WithPrefix(prefix string) Option { return func(o *Options) { o.Prefix = prefix } }

// WithWatchInterval sets Options.WatchInterval.
func WithWatchInterval(d time.Duration) Option { return func(o *Options) { o.WatchInterval = d } }

// WithObserver sets Options.Observer.
func WithObserver(obs fence.WriteObserver) Option { return func(o *Options) { o.Observer = obs } }

// Fence is River worker middleware (rivertype.WorkerMiddleware) that
// fences every attempt of the jobs it wraps: put it in river.Config's
// Middleware (every job) or a worker's Middleware (that worker's jobs).
// It is safe for concurrent use.
type Fence struct {
	river.MiddlewareDefaults

	db    DB
	opts  Options
	guard *sqlguard.Guard

	// Names and statements, built once from the options.
	jobTable, resourceTable string // quoted and qualified as configured
	triggerFn, claimFn      string
	claimSQL, watchSQL      string
}

var _ rivertype.WorkerMiddleware = (*Fence)(nil)

// New returns a Fence over db, the database River works in. It does no
// I/O; run Check at start-up. It returns an error matching
// fence.ErrInvalidArgument, naming every problem, for a nil db, a schema
// that is not a valid identifier, an empty prefix (one given empty on
// purpose) or a WatchInterval below MinWatchInterval.
func New(db DB, opts ...Option) (*Fence, error) {
	o := Options{Prefix: DefaultPrefix, WatchInterval: DefaultWatchInterval}
	prefixSet := false
	for _, opt := range opts {
		if opt != nil {
			before := o.Prefix
			opt(&o)
			prefixSet = prefixSet || o.Prefix != before
		}
	}
	var errs []error
	if rowguard.IsNil(db) {
		errs = append(errs, fmt.Errorf("%w: riverfence: nil database", fence.ErrInvalidArgument))
	}
	for _, s := range []struct{ what, v string }{{"schema", o.Schema}, {"River schema", o.RiverSchema}} {
		if s.v != "" {
			if err := checkIdent(s.what, s.v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if o.Prefix == "" {
		errs = append(errs, fmt.Errorf("%w: riverfence: empty resource prefix", fence.ErrInvalidArgument))
	}
	if o.WatchInterval < MinWatchInterval {
		errs = append(errs, fmt.Errorf("%w: riverfence: watch interval %v is below %v", fence.ErrInvalidArgument, o.WatchInterval, MinWatchInterval))
	}
	guard, err := sqlguard.New(sqlguard.WithSchema(o.Schema), sqlguard.WithObserver(o.Observer))
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !prefixSet && o.RiverSchema != "" {
		o.Prefix = "river/" + o.RiverSchema + "/job/"
	}
	f := &Fence{db: db, opts: o, guard: guard,
		jobTable:      qualified(o.RiverSchema, "river_job"),
		resourceTable: qualified(o.Schema, sqlguard.ResourceTable),
		triggerFn:     qualified(o.RiverSchema, triggerName),
		claimFn:       qualified(o.RiverSchema, claimName),
	}
	f.build()
	return f, nil
}

// build makes the Fence's statements.
func (f *Fence) build() {
	// The claim: Install's function mints the next token and keeps it
	// only while the job's row shows the attempt's fetch (claimSQL).
	f.claimSQL = `SELECT ` + f.claimFn + `($1, $2, $3, $4)`
	// The watch: the job's row (state, attempt, attempted_at, the identity
	// of the last recorded report) and the resource's newest token.
	f.watchSQL = `SELECT j.state::text, j.attempt, j.attempted_at, j.metadata -> '` + MetadataKey + `' ->> 'at', j.metadata -> '` + MetadataKey + `' ->> 'attempt',
	(SELECT token FROM ` + f.resourceTable + ` WHERE resource = $2)
FROM (SELECT 1) AS one LEFT JOIN ` + f.jobTable + ` AS j ON j.id = $1`
}

// Options returns a copy of the Fence's options, defaults filled in.
func (f *Fence) Options() Options { return f.opts }

// Resource returns the name of the job's resource: the row of sqlguard's
// table fencekit_resource_tokens that holds the newest token of the job's
// attempts, and the resource Complete's transaction advances.
func (f *Fence) Resource(jobID int64) string {
	return f.opts.Prefix + strconv.FormatInt(jobID, 10)
}

// Attempt is one attempt of a job, as the middleware fenced it.
type Attempt struct {
	// JobID is the job's id; Resource its resource (Fence.Resource).
	JobID    int64
	Resource string
	// Number is River's attempt number (it repeats after a snooze: it is
	// not the token), and AttemptedAt the time River fetched the job for
	// this attempt (the database's clock, to the microsecond). Together
	// they name the fetch.
	Number      int
	AttemptedAt time.Time
	// Token is the attempt's fencing token: greater than the token of
	// every earlier attempt of the job, never repeated.
	Token fence.Token
}

// identity is the attempt's report tag (MetadataKey).
func (a Attempt) identity() map[string]any {
	id := map[string]any{"attempt": a.Number, "at": a.AttemptedAt.UnixMicro()}
	if a.Token != fence.None {
		id["token"] = uint64(a.Token)
	}
	return id
}

// ErrSuperseded is matched by a *SupersededError: the attempt is no
// longer the job's current one.
var ErrSuperseded = errors.New("riverfence: attempt superseded")

// ErrNoAttempt is returned by Complete and CompleteTx, and by AttemptFrom's
// callers' helpers, when the context is not that of a job fenced by a
// Fence: the middleware is missing from river.Config.Middleware (or the
// worker's Middleware). It matches fence.ErrSetup.
var ErrNoAttempt error = &fence.SetupError{
	Err: errors.New("riverfence: no fenced attempt in the context"),
	Fix: "add the *riverfence.Fence to river.Config.Middleware (or the worker's Middleware), and call Complete with the context Work was given",
}

// SupersededError says that an attempt was superseded, and by what. It
// matches ErrSuperseded.
type SupersededError struct {
	JobID int64
	// Attempt and Token are the superseded attempt's.
	Attempt int
	Token   fence.Token
	// State is the job's state as last read ("" when the job is gone),
	// CurrentAttempt River's attempt number on the row then, and Current
	// the job's newest token then (fence.None when not read).
	State          string
	CurrentAttempt int
	Current        fence.Token
	// Reason says what happened, in words.
	Reason string
}

func (e *SupersededError) Error() string {
	tok := "no token"
	if e.Token != fence.None {
		tok = "token " + e.Token.String()
	}
	return fmt.Sprintf("riverfence: attempt %d of job %d (%s) superseded: %s", e.Attempt, e.JobID, tok, e.Reason)
}

// Is reports whether target is ErrSuperseded.
func (e *SupersededError) Is(target error) bool { return target == ErrSuperseded }

// row is what a claim, the watch and a completion read of the job's row.
type row struct {
	found       bool
	state       string
	attempt     int
	attemptedAt time.Time
	// reported is the identity of the last recorded report (MetadataKey):
	// at and attempt as text, "" when there is none.
	reportedAt, reportedAttempt string
	current                     fence.Token
}

// fetchedBy reports whether the row still shows a's fetch.
func (r row) fetchedBy(a *Attempt) bool {
	return r.found && r.attempt == a.Number && r.attemptedAt.Equal(a.AttemptedAt)
}

// supersedes returns why the row shows that a is no longer the job's
// current attempt, or nil. A row that a's own completion finished (its
// report recorded, the fetch unchanged) does not supersede it.
func (r row) supersedes(a *Attempt) *SupersededError {
	e := &SupersededError{JobID: a.JobID, Attempt: a.Number, Token: a.Token, State: r.state, CurrentAttempt: r.attempt, Current: r.current}
	switch {
	case !r.found:
		e.Reason = "the job is gone"
	case a.Token != fence.None && r.current > a.Token:
		e.Reason = fmt.Sprintf("a later attempt claimed token %d (the job is %s, attempt %d)", r.current, r.state, r.attempt)
	case !r.fetchedBy(a):
		e.Reason = fmt.Sprintf("River fetched the job again (attempt %d, %s)", r.attempt, r.state)
	case r.state == string(rivertype.JobStateRunning):
		return nil
	case r.reportedAt == strconv.FormatInt(a.AttemptedAt.UnixMicro(), 10) && r.reportedAttempt == strconv.Itoa(a.Number):
		return nil // this attempt's own outcome, recorded
	default:
		e.Reason = fmt.Sprintf("River ended the attempt without it (the job is %s: rescued, cancelled or deleted)", r.state)
	}
	return e
}

// read reads the job's row and its resource's newest token.
func (f *Fence) read(ctx context.Context, a *Attempt) (row, error) {
	var (
		r              row
		state, at, att *string
		attempt        *int
		attemptedAt    *time.Time
		current        *int64
	)
	if err := f.db.QueryRow(ctx, f.watchSQL, a.JobID, a.Resource).Scan(&state, &attempt, &attemptedAt, &at, &att, &current); err != nil {
		return r, fmt.Errorf("riverfence: read job %d: %w", a.JobID, err)
	}
	if state == nil {
		return r, nil
	}
	r.found, r.state = true, *state
	if attempt != nil {
		r.attempt = *attempt
	}
	if attemptedAt != nil {
		r.attemptedAt = *attemptedAt
	}
	if at != nil {
		r.reportedAt = *at
	}
	if att != nil {
		r.reportedAttempt = *att
	}
	if current != nil && *current > 0 {
		r.current = fence.Token(*current)
	}
	return r, nil
}

// claim mints the attempt's token and keeps it only if the job's row still
// shows the attempt's fetch: one statement in its own transaction (one
// round trip), a call of the function Install creates (see claimSQL).
func (f *Fence) claim(ctx context.Context, a *Attempt) (fence.Token, error) {
	var tok int64
	err := f.db.QueryRow(ctx, f.claimSQL, a.Resource, a.JobID, a.Number, a.AttemptedAt).Scan(&tok)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return fence.Token(tok), nil
	case errors.As(err, &pgErr) && pgErr.Code == codeSuperseded:
		// DETAIL: the row's state and attempt ("" and 0 when it is gone).
		r := row{}
		if state, attempt, ok := strings.Cut(pgErr.Detail, " "); ok && state != "" {
			r.found, r.state = true, state
			r.attempt, _ = strconv.Atoi(attempt)
		}
		sup := r.supersedes(a)
		if sup == nil || (r.found && r.attempt == a.Number) {
			sup = &SupersededError{JobID: a.JobID, Attempt: a.Number, State: r.state, CurrentAttempt: r.attempt,
				Reason: "the job is " + r.state + ": River ended the attempt before it began"}
		}
		return fence.None, sup
	}
	return fence.None, f.setupErr(ctx, fmt.Errorf("riverfence: claim job %d attempt %d: %w", a.JobID, a.Number, err))
}

// codeSuperseded is the SQLSTATE the claim function raises when the job's
// row no longer shows the attempt's fetch.
const codeSuperseded = "FK410"

// setupErr turns an error of the claim that says the toolkit's table or
// River's is missing into a *fence.SetupError naming the fix.
func (f *Fence) setupErr(ctx context.Context, err error) error {
	if cerr := f.Check(ctx); errors.Is(cerr, fence.ErrSetup) {
		return errors.Join(err, cerr)
	}
	return err
}

type attemptKey struct{}

// running is the attempt of a job being worked, in its context.
type running struct {
	f *Fence
	a Attempt
	// st is the attempt's outcome so far (watch.go); cancel ends the
	// attempt's context.
	st     *outcome
	cancel context.CancelCauseFunc
}

// AttemptFrom returns the attempt the context's job is running under, if
// the middleware fenced it.
func AttemptFrom(ctx context.Context) (Attempt, bool) {
	r, ok := ctx.Value(attemptKey{}).(*running)
	if !ok {
		return Attempt{}, false
	}
	return r.a, true
}

// Work implements rivertype.WorkerMiddleware. It tags the attempt's
// report (MetadataKey), claims the attempt's token, and runs the rest of
// the stack with a context that carries the token (fence.FromContext) and
// the attempt (AttemptFrom), and that ends, with a *SupersededError as its
// cause, when the attempt is superseded (read every WatchInterval).
//
// It returns, without running the job, a *SupersededError when the job's
// row no longer shows this attempt's fetch (a later attempt was fetched,
// or River ended this one), and the database's error when the claim
// failed (joined with a *fence.SetupError when the database is not set up:
// see Check). Otherwise it returns the job's error, joined with the
// *SupersededError when the attempt was superseded while it ran, so that
// River never records a superseded attempt as a success. Whatever it
// returns, River records it only if the attempt is still the row's current
// fetch (the trigger of Install).
func (f *Fence) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job == nil || job.AttemptedAt == nil {
		return fmt.Errorf("%w: riverfence: a job row without attempted_at (not fetched by River)", fence.ErrInvalidArgument)
	}
	a := Attempt{JobID: job.ID, Resource: f.Resource(job.ID), Number: job.Attempt, AttemptedAt: *job.AttemptedAt}
	// Tag the report first: whatever happens next, River's record of this
	// attempt carries its identity.
	if err := river.MetadataSet(ctx, MetadataKey, a.identity()); err != nil {
		return fmt.Errorf("riverfence: job %d: %w", job.ID, err)
	}
	tok, err := f.claim(ctx, &a)
	if err != nil {
		return err
	}
	a.Token = tok
	if err := river.MetadataSet(ctx, MetadataKey, a.identity()); err != nil {
		return fmt.Errorf("riverfence: job %d: %w", job.ID, err)
	}
	r := &running{f: f, a: a, st: &outcome{}}
	work, cancel := context.WithCancelCause(context.WithValue(fence.NewContext(ctx, tok), attemptKey{}, r))
	defer cancel(nil)
	r.cancel = cancel
	stop := f.watch(work, r, cancel)
	err = doInner(work)
	stop()
	if sup := r.st.superseded(); sup != nil && !r.st.completed() {
		return errors.Join(sup, err)
	}
	return err
}

// checkIdent validates one identifier (see pgident.Check).
func checkIdent(kind, s string) error {
	return pgident.Check(fence.ErrInvalidArgument, "riverfence: "+kind, s)
}

// qualified is name, quoted, qualified by schema when it is set.
func qualified(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}
