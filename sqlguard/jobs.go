package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockversion"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// JobsTable is the toolkit's job table, created by `fencekit migrate up`
// (migrations.Up, migration 00008): see Jobs.
const JobsTable = "fencekit_jobs"

// jobsMigration is the version of the migration that creates JobsTable
// (migrations.JobsMigration).
const jobsMigration = 8

// The states of a job in a job table.
const (
	JobAvailable = "available" // waiting for run_at, then for a claim
	JobRunning   = "running"   // claimed by an attempt until claimed_until
	JobCompleted = "completed" // completed by an attempt: final
	JobFailed    = "failed"    // failed for good by an attempt: final
)

// ErrNoJob is returned by Jobs.Claim when no job is runnable: none is
// available and due, and no running job's claim has expired.
var ErrNoJob = errors.New("sqlguard: no job to claim")

// ErrJobNotRunning is matched by the error a heartbeat, a completion or a
// failure returns when the attempt's token is still the job's newest but
// the job is no longer running: this attempt completed or failed it
// already. It is never a stale token.
var ErrJobNotRunning = errors.New("sqlguard: the job is not running")

// Job is one attempt of a job, as Jobs.Claim granted it.
type Job struct {
	// ID is the job's id (the table's id column).
	ID int64
	// Attempt counts the job's claims, this one included.
	Attempt int
	// Token is the attempt's fencing token: greater than every token an
	// earlier attempt of the job had. Present it to every write the job
	// makes (any guard takes it), and to Heartbeat, Complete and Fail.
	Token fence.Token
	// ClaimedUntil is when the claim expires unless a heartbeat extends
	// it (the database's clock): then another worker's Claim may take the
	// job over with a greater token.
	ClaimedUntil time.Time
}

// Jobs fences a job table of one's own: the table services keep when they
// run jobs with their own SELECT ... FOR UPDATE SKIP LOCKED loop. Each
// claim of a job is an attempt with a fencing token of its own, minted
// with the claim, and the attempt's heartbeat, completion and failure
// each write only while the token is the job's newest: an attempt that
// was paused past its claim, whose job another worker claimed since, can
// neither extend, complete nor fail it, and its other writes, presenting
// the same token to any guard, are refused there once the newer attempt
// has written.
//
// The table has these columns (JobsTable, created by `fencekit migrate
// up`, has them, and queue, kind, payload and created_at besides):
//
//	id            bigint      PRIMARY KEY (bigserial)
//	state         text        NOT NULL DEFAULT 'available'  -- available, running, completed, failed
//	attempt       integer     NOT NULL DEFAULT 0
//	run_at        timestamptz NOT NULL DEFAULT now()
//	claimed_until timestamptz                               -- NULL unless running
//	last_error    text
//	finished_at   timestamptz
//	lock_version  bigint      NOT NULL DEFAULT 0 CHECK (lock_version >= 0)
//
// and, for Claim with a queue, a queue text column. To fence a table of
// your own, add the columns it lacks (ALTER TABLE ... ADD COLUMN, in a
// migration of yours), index the claim's scan (queue, run_at, id) WHERE
// state IN ('available', 'running'), and run Check at start-up. A job is
// inserted with state 'available' (the default) and lock_version 0.
// lock_version is written by Jobs and by nothing else; state, attempt,
// claimed_until and finished_at only by Jobs once a job is inserted.
//
// A Jobs is safe for concurrent use.
type Jobs struct {
	db     DBTX
	table  *Table // the name, the quoted identifier, the resource format
	schema string // as given to NewJobs
	name   string // as given to NewJobs, for the fix of a setup error
	claim  string // the claim statement, without a queue
	claimQ,
	heartbeat, complete, fail, retry string
}

// NewJobs returns a Jobs over the table name in schema (empty: found
// through the search_path), claiming through db (a pool, usually). name
// is JobsTable unless the jobs are in a table of your own of the shape
// above. It does no I/O. Errors: as NewTable's, and
// fence.ErrInvalidArgument for a nil db.
func NewJobs(db DBTX, schema, name string) (*Jobs, error) {
	t, err := NewTable(schema, name, "id")
	if rowguard.IsNil(db) {
		err = errors.Join(err, fmt.Errorf("%w: jobs: nil database", fence.ErrInvalidArgument))
	}
	if err != nil {
		return nil, err
	}
	j := &Jobs{db: db, table: t, schema: schema, name: name}
	j.build()
	return j, nil
}

// build makes the statements.
func (j *Jobs) build() {
	t := j.table.ident
	// The claim: the oldest due job that is available, or running with an
	// expired claim (its attempt is presumed dead, or paused: the new
	// token fences it), skipping rows another transaction holds. The
	// token is the larger of the row's + 1 and the server clock in
	// microseconds, so that it grows even over a row restored from a
	// backup. $1 is the claim's length in microseconds.
	claim := func(queue string) string {
		return `WITH next AS (
	SELECT id FROM ` + t + `
	WHERE ` + queue + `run_at <= pg_catalog.now()
	  AND (state = 'available' OR (state = 'running' AND claimed_until < pg_catalog.now()))
	ORDER BY run_at, id
	LIMIT 1
	FOR UPDATE SKIP LOCKED)
UPDATE ` + t + ` AS j SET state = 'running', attempt = j.attempt + 1,
	lock_version = GREATEST(j.lock_version + 1, (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000000)::bigint),
	claimed_until = pg_catalog.now() + $1 * interval '1 microsecond'
FROM next WHERE j.id = next.id
RETURNING j.id, j.attempt, j.lock_version, j.claimed_until`
	}
	j.claim = claim("")
	j.claimQ = claim(`queue = $2 AND `)
	// A write of the attempt with token $2 on job $1: it locks the row,
	// then writes only if the job runs and its token is not newer than
	// $2, and reports what it found (see Table's exact statement).
	write := func(set string) string {
		return `WITH cur AS (SELECT state, lock_version FROM ` + t + ` WHERE id = $1 FOR NO KEY UPDATE),
w AS (UPDATE ` + t + ` SET ` + set + `, lock_version = $2
	WHERE id = $1 AND state = 'running' AND lock_version <= $2 AND ` + lockversion.IsBigint(t) + `
	RETURNING 1)
SELECT (SELECT count(*) FROM cur), (SELECT state FROM cur), (SELECT lock_version FROM cur), (SELECT count(*) FROM w)`
	}
	j.heartbeat = write(`claimed_until = pg_catalog.now() + $3 * interval '1 microsecond'`)
	j.complete = write(`state = 'completed', claimed_until = NULL, finished_at = pg_catalog.now()`)
	j.fail = write(`state = 'failed', claimed_until = NULL, finished_at = pg_catalog.now(), last_error = $3`)
	j.retry = write(`state = 'available', claimed_until = NULL, run_at = $4, last_error = $3`)
}

// Claim claims the oldest runnable job of queue (every queue when queue is
// empty; a table without a queue column takes only ""): one that is
// available and due, or running with a claim that has expired. The claim
// lasts lease, unless heartbeats extend it. It is one statement (one
// round trip): a SELECT ... FOR UPDATE SKIP LOCKED of the job, and the
// update that makes it running, counts the attempt and mints its token.
//
// It returns the attempt; ErrNoJob when no job is runnable; a
// *fence.SetupError when the table or a column is missing (Check names
// what); fence.ErrInvalidArgument, before any I/O, when lease is not
// positive; a *fence.RetryableError on a serialization failure or
// deadlock; other database errors wrapped. ctx bounds the statement.
func (j *Jobs) Claim(ctx context.Context, queue string, lease time.Duration) (Job, error) {
	if j == nil {
		return Job{}, fmt.Errorf("sqlguard: jobs: claim: %w: nil *Jobs (from a failed NewJobs?)", fence.ErrInvalidArgument)
	}
	if lease <= 0 {
		return Job{}, fmt.Errorf("sqlguard: jobs %s: claim: %w: the claim's length %v is not positive", j.table.spec.Name, fence.ErrInvalidArgument, lease)
	}
	stmt, args := j.claim, []any{lease.Microseconds()}
	if queue != "" {
		stmt, args = j.claimQ, append(args, queue)
	}
	var (
		job Job
		tok int64
	)
	err := j.db.QueryRow(ctx, stmt, args...).Scan(&job.ID, &job.Attempt, &tok, &job.ClaimedUntil)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Job{}, ErrNoJob
	case err != nil:
		return Job{}, j.setupErr(ctx, wrapDBErr("jobs "+j.table.spec.Name+": claim", err))
	}
	job.Token = fence.Token(tok)
	return job, nil
}

// Heartbeat extends the attempt's claim to lease from now (the database's
// clock). It returns nil when extended; a *fence.StaleError naming both
// tokens when a later attempt has claimed the job (this attempt must
// stop: its claim is gone); an error matching ErrJobNotRunning when the
// job is no longer running (this attempt completed or failed it);
// a *fence.NotFoundError when the job is gone; fence.ErrInvalidArgument
// (fence.ErrInvalidToken for token 0), before any I/O, for a bad job or a
// lease that is not positive; the errors of a Table write for the rest
// (fence.ErrOutcomeUnknown when the statement was sent and no answer
// came). ctx bounds the statement.
func (j *Jobs) Heartbeat(ctx context.Context, job Job, lease time.Duration) error {
	var leaseErr error
	if lease <= 0 {
		leaseErr = fmt.Errorf("%w: the claim's length %v is not positive", fence.ErrInvalidArgument, lease)
	}
	return j.write(ctx, j.db, "heartbeat", j.heartbeat, job, leaseErr, lease.Microseconds())
}

// Complete records the job completed by the attempt, through db: pass the
// job's own transaction, so that its writes and its completion commit
// together. The statement locks the job's row until db's transaction
// ends, so no other worker can claim the job meanwhile: a transaction
// whose Complete succeeded commits the job's writes as the job's current
// attempt's. Call it first or last in the transaction; if it fails, roll
// the transaction back.
//
// It returns nil when recorded; a *fence.StaleError naming both tokens
// when a later attempt has claimed the job (nothing was recorded, and the
// transaction's other writes must not commit); otherwise Heartbeat's
// errors. A nil db is refused (fence.ErrInvalidArgument), never replaced by
// the Jobs' own database. ctx bounds the statement.
func (j *Jobs) Complete(ctx context.Context, db DBTX, job Job) error {
	return j.write(ctx, db, "complete", j.complete, job, nilDB(db))
}

// Fail records the attempt's failure, through db (the job's transaction,
// or the Jobs' database): with a zero retryAt the job fails for good
// (state failed); otherwise it is available again from retryAt, for a
// later attempt to claim. reason is kept in last_error. Its outcomes are
// Complete's. ctx bounds the statement.
func (j *Jobs) Fail(ctx context.Context, db DBTX, job Job, reason string, retryAt time.Time) error {
	if retryAt.IsZero() {
		return j.write(ctx, db, "fail", j.fail, job, nilDB(db), reason)
	}
	return j.write(ctx, db, "fail", j.retry, job, nilDB(db), reason, retryAt)
}

// nilDB is the error of a nil transaction, or nil.
func nilDB(db DBTX) error {
	if rowguard.IsNil(db) {
		return fmt.Errorf("%w: nil transaction", fence.ErrInvalidArgument)
	}
	return nil
}

// write runs one of the attempt's writes, stmt with $1 the job's id, $2
// its token and args after, and says exactly why it wrote nothing.
func (j *Jobs) write(ctx context.Context, db DBTX, op, stmt string, job Job, argErr error, args ...any) error {
	if j == nil {
		return fmt.Errorf("sqlguard: jobs: %s: %w: nil *Jobs (from a failed NewJobs?)", op, fence.ErrInvalidArgument)
	}
	resource := j.table.spec.Resource([]any{job.ID})
	tok, err := tokenArg(job.Token)
	if err := errors.Join(argErr, err); err != nil {
		return fmt.Errorf("sqlguard: jobs: %s %s: %w", op, resource, err)
	}
	var (
		found, written int
		state          *string
		current        *int64
	)
	err = db.QueryRow(ctx, stmt, append([]any{job.ID, tok}, args...)...).Scan(&found, &state, &current, &written)
	switch {
	case err != nil:
		return j.setupErr(ctx, sentErr("jobs: "+op+" "+resource, err, connOf(db)))
	case written == 1:
		return nil
	case found == 0:
		return &fence.NotFoundError{Resource: resource}
	case current != nil && *current > tok:
		return fence.Stale(resource, job.Token, fence.Token(*current))
	case state != nil && *state != JobRunning:
		return fmt.Errorf("sqlguard: jobs: %s %s: %w: it is %s", op, resource, ErrJobNotRunning, *state)
	}
	// lock_version is not bigint: the statement's own check wrote nothing.
	return &fence.SetupError{Err: fmt.Errorf("sqlguard: jobs: %s %s: %w", op, resource, fence.ErrLockVersionType),
		Fix: "make " + j.table.spec.Name + ".lock_version bigint"}
}

// setupErr joins to err, a mapped error of a statement, the setup
// problems Check names when the statement found a table or a column
// missing; otherwise it returns err as it is.
func (j *Jobs) setupErr(ctx context.Context, err error) error {
	if code := pgCode(err); code == codeUndefinedTable || code == codeUndefinedColumn || code == codeInvalidSchemaName {
		if cerr := j.Check(ctx); errors.Is(cerr, fence.ErrSetup) {
			return errors.Join(err, cerr)
		}
	}
	return err
}

// jobsCheckSQL reads, for the table $1 (quoted), whether it exists and the
// type of each of the columns $2 ("" when missing).
const jobsCheckSQL = `SELECT r.oid IS NOT NULL,
	pg_catalog.array_agg(coalesce((SELECT pg_catalog.format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = r.oid AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped), '') ORDER BY n)
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r, pg_catalog.unnest($2::text[]) WITH ORDINALITY AS u(c, n)
GROUP BY r.oid`

// jobsColumns are the columns Jobs reads and writes, with the types it
// takes for each.
var jobsColumns = []struct {
	name  string
	types []string
	add   string // the column as ALTER TABLE ... ADD COLUMN takes it
}{
	{"id", []string{"bigint", "integer"}, "id bigserial PRIMARY KEY"},
	{"state", []string{"text", "character varying"}, "state text NOT NULL DEFAULT 'available'"},
	{"attempt", []string{"integer", "bigint"}, "attempt integer NOT NULL DEFAULT 0"},
	{"run_at", []string{"timestamp with time zone"}, "run_at timestamptz NOT NULL DEFAULT now()"},
	{"claimed_until", []string{"timestamp with time zone"}, "claimed_until timestamptz"},
	{"last_error", []string{"text", "character varying"}, "last_error text"},
	{"finished_at", []string{"timestamp with time zone"}, "finished_at timestamptz"},
	{"lock_version", []string{"bigint"}, "lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0)"},
}

// Check checks, through the Jobs' database, that the table is set up: it
// exists, with every column of the shape above and its type, and (for
// JobsTable, when the schema holds `fencekit migrate`'s version table)
// that its migration is applied. It returns nil, or every problem as a
// *fence.SetupError naming the fix (fence.ErrNoTable, fence.ErrNotMigrated,
// fence.ErrLockVersionType: errors.Is(err, fence.ErrSetup) holds), or the
// database's error. It reads the catalog only. ctx bounds the reads.
func (j *Jobs) Check(ctx context.Context) error {
	if j == nil {
		return fmt.Errorf("sqlguard: jobs: check: %w: nil *Jobs (from a failed NewJobs?)", fence.ErrInvalidArgument)
	}
	names := make([]string, len(jobsColumns))
	for i, c := range jobsColumns {
		names[i] = c.name
	}
	var (
		exists bool
		types  []string
	)
	if err := j.db.QueryRow(ctx, jobsCheckSQL, j.table.ident, names).Scan(&exists, &types); err != nil {
		return wrapDBErr("jobs "+j.table.spec.Name+": check", err)
	}
	cmd := "fencekit migrate up"
	if s := j.schema; s != "" {
		cmd += " --schema " + pgident.ShellWord(s)
	}
	if !exists {
		if j.name == JobsTable {
			return fence.Setup("run `"+cmd+"` (migration 00008 creates "+JobsTable+")",
				"sqlguard: jobs: check: %w: %s not found (%w)", fence.ErrNoTable, j.table.spec.Name, fence.ErrNotMigrated)
		}
		return fence.Setup("create it with the columns of sqlguard.Jobs, or use "+JobsTable+" (`"+cmd+"`)",
			"sqlguard: jobs: check: %w: %s not found", fence.ErrNoTable, j.table.spec.Name)
	}
	var errs []error
	for i, c := range jobsColumns {
		switch typ := types[i]; {
		case typ == "":
			errs = append(errs, fence.Setup("ALTER TABLE "+j.table.ident+" ADD COLUMN "+c.add,
				"sqlguard: jobs: check: %s has no column %s", j.table.spec.Name, c.name))
		case c.name == LockVersionColumn && typ != "bigint":
			errs = append(errs, &fence.SetupError{Err: fmt.Errorf("sqlguard: jobs: check: %w: %s.lock_version is %s", fence.ErrLockVersionType, j.table.spec.Name, typ),
				Fix: "make it bigint: ALTER TABLE " + j.table.ident + " ALTER COLUMN lock_version TYPE bigint"})
		case !slices.Contains(c.types, typ):
			errs = append(errs, fence.Setup("make it "+c.types[0],
				"sqlguard: jobs: check: %s.%s is %s, want %s", j.table.spec.Name, c.name, typ, strings.Join(c.types, " or ")))
		}
	}
	if j.name == JobsTable {
		errs = append(errs, migrationProblem(ctx, j.db, j.schema, jobsMigration, JobsTable, cmd))
	}
	return errors.Join(errs...)
}

// pgCode is the SQLSTATE of the *pgconn.PgError in err's chain, or "".
func pgCode(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}
