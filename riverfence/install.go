package riverfence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
)

// triggerName names the trigger Install puts on river_job, and its
// function; claimName the function that claims an attempt's token. Both
// functions are in River's schema.
const (
	triggerName = "fencekit_river_attempt_fence"
	claimName   = "fencekit_river_claim"
)

// claimSQL creates the claim function; %[1]s is the function, %[2]s
// fencekit_resource_tokens, %[3]s river_job (each quoted and qualified).
//
// It mints the next token of the job's resource: the larger of the stored
// token + 1 and the server clock in microseconds, so that tokens keep
// growing if the row is lost (as pglease's do). The INSERT takes the
// resource's row lock first; the SELECT that follows is a statement of its
// own, whose snapshot is taken after the lock, so it sees every fetch of
// the job committed before any later claim could mint. When the row does
// not show the attempt's fetch running, it raises FK410 (DETAIL: the
// row's state and attempt), which undoes the mint: a claim that lost
// stores nothing.
const claimSQL = `CREATE OR REPLACE FUNCTION %[1]s(p_resource text, p_job bigint, p_attempt integer, p_attempted_at timestamptz)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    minted  bigint;
    j_state text;
    j_try   integer;
    j_at    timestamptz;
BEGIN
    INSERT INTO %[2]s AS r (resource, token)
    VALUES (p_resource, (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000000)::bigint)
    ON CONFLICT (resource) DO UPDATE SET token = GREATEST(r.token + 1, EXCLUDED.token), updated_at = pg_catalog.now()
    RETURNING r.token INTO minted;
    SELECT j.state::text, j.attempt, j.attempted_at INTO j_state, j_try, j_at FROM %[3]s AS j WHERE j.id = p_job;
    IF j_state IS DISTINCT FROM 'running' OR j_try IS DISTINCT FROM p_attempt OR j_at IS DISTINCT FROM p_attempted_at THEN
        RAISE EXCEPTION USING ERRCODE = 'FK410',
            MESSAGE = pg_catalog.format('fencekit: attempt %%s of job %%s superseded', p_attempt, p_job),
            DETAIL = coalesce(j_state, '') || ' ' || coalesce(j_try, 0)::text;
    END IF;
    RETURN minted;
END
$fn$`

// installSQL creates the function and the trigger; %[1]s is the function,
// %[2]s river_job, %[3]s the trigger's name (each quoted).
//
// An update of a job's row that brings a new report identity in the
// metadata (MetadataKey: River merging the metadata of an attempt's
// outcome, from its completer or JobCompleteTx) is the record of that
// attempt's end. It is kept only when the identity is the row's current
// fetch (OLD.attempt and OLD.attempted_at, before the update); otherwise
// the row is left as it is (RETURN NULL: the statement updates nothing
// there, and River reads the row back unchanged). Every other update
// (River's fetch, rescue, retry, cancel, a report of a job not fenced)
// brings no new identity and passes.
const installSQL = `CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    reported jsonb := NEW.metadata -> '` + MetadataKey + `';
    before   jsonb := OLD.metadata -> '` + MetadataKey + `';
BEGIN
    IF before IS NOT NULL
       AND reported ->> 'attempt' IS NOT DISTINCT FROM before ->> 'attempt'
       AND reported ->> 'at' IS NOT DISTINCT FROM before ->> 'at' THEN
        RETURN NEW; -- no new report
    END IF;
    IF reported ->> 'attempt' = OLD.attempt::text
       AND reported ->> 'at' = ((extract(epoch FROM OLD.attempted_at) * 1000000)::bigint)::text THEN
        RETURN NEW; -- the report of the row's current fetch
    END IF;
    RETURN NULL; -- a superseded attempt's report: the row stays as it is
END
$fn$;
CREATE OR REPLACE TRIGGER %[3]s BEFORE UPDATE ON %[2]s
    FOR EACH ROW WHEN (NEW.metadata ? '` + MetadataKey + `') EXECUTE FUNCTION %[1]s()`

// Install creates, in River's schema, the function that claims each
// attempt's token, and the trigger that keeps a superseded attempt's
// outcome off the job's row (see the package doc), replacing those there
// (it is idempotent). Run it once River's tables exist (after
// rivermigrate), and again after a River migration that recreates
// river_job; Check reports a missing trigger. It needs the privilege to
// create a function in River's schema and a trigger on river_job. ctx
// bounds the statements.
func (f *Fence) Install(ctx context.Context) error {
	if _, err := f.db.Exec(ctx, fmt.Sprintf(claimSQL, f.claimFn, f.resourceTable, f.jobTable)); err != nil {
		return fmt.Errorf("riverfence: install the claim function %s: %w", f.claimFn, err)
	}
	sql := fmt.Sprintf(installSQL, f.triggerFn, f.jobTable, pgx.Identifier{triggerName}.Sanitize())
	if _, err := f.db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("riverfence: install the trigger on %s: %w", f.jobTable, err)
	}
	return nil
}

// checkSQL reads whether river_job ($1) exists, whether it has the
// trigger, enabled, and whether the claim function ($2, with its argument
// types) exists.
const checkSQL = `SELECT r.oid IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
	WHERE t.tgrelid = r.oid AND t.tgname = '` + triggerName + `' AND t.tgenabled <> 'D'),
	pg_catalog.to_regprocedure($2) IS NOT NULL
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r`

// Check checks that the database is set up for the Fence: fencekit's
// table and function (sqlguard.Guard.Check: `fencekit migrate up`),
// River's job table, and the trigger Install creates. It returns nil, or
// every problem found as a *fence.SetupError naming its fix (joined:
// errors.Is(err, fence.ErrSetup) holds), or the database's error when the
// catalog could not be read. It reads the catalog only. ctx bounds the
// reads.
func (f *Fence) Check(ctx context.Context) error {
	var hasTable, hasTrigger, hasClaim bool
	if err := f.db.QueryRow(ctx, checkSQL, f.jobTable, f.claimFn+"(text,bigint,integer,timestamptz)").Scan(&hasTable, &hasTrigger, &hasClaim); err != nil {
		return fmt.Errorf("riverfence: check: %w", err)
	}
	errs := []error{f.guard.Check(ctx, f.db)}
	switch {
	case !hasTable:
		errs = append(errs, fence.Setup("run River's migrations (rivermigrate, or `river migrate-up`) in "+f.riverWhere()+", or fix Options.RiverSchema",
			"riverfence: check: %w: River's table %s not found", fence.ErrNoTable, f.jobTable))
	case !hasTrigger || !hasClaim:
		var missing []string
		if !hasClaim {
			missing = append(missing, "no function "+claimName+": no attempt can claim a token")
		}
		if !hasTrigger {
			missing = append(missing, "no trigger "+triggerName+" on river_job: a superseded attempt's outcome would be recorded on the job")
		}
		errs = append(errs, fence.Setup("call Fence.Install once River's tables exist",
			"riverfence: check: %w: %s", fence.ErrNotMigrated, strings.Join(missing, "; ")))
	}
	return errors.Join(errs...)
}

func (f *Fence) riverWhere() string {
	if f.opts.RiverSchema == "" {
		return "the connection's search_path"
	}
	return "schema " + f.opts.RiverSchema
}
