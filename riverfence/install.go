package riverfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
)

// triggerName names the trigger Install puts on river_job, and its
// function (in River's schema).
const triggerName = "fencekit_river_attempt_fence"

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

// Install creates, in River's schema, the trigger that keeps a superseded
// attempt's outcome off the job's row (see the package doc), replacing the
// one there (it is idempotent). Run it once River's tables exist (after
// rivermigrate), and again after a River migration that recreates
// river_job; Check reports a missing trigger. It needs the privilege to
// create a function in River's schema and a trigger on river_job. ctx
// bounds the statements.
func (f *Fence) Install(ctx context.Context) error {
	sql := fmt.Sprintf(installSQL, f.triggerFn, f.jobTable, pgx.Identifier{triggerName}.Sanitize())
	if _, err := f.db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("riverfence: install the trigger on %s: %w", f.jobTable, err)
	}
	return nil
}

// checkSQL reads whether river_job ($1) exists and whether it has the
// trigger, enabled.
const checkSQL = `SELECT r.oid IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
	WHERE t.tgrelid = r.oid AND t.tgname = '` + triggerName + `' AND t.tgenabled <> 'D')
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r`

// Check checks that the database is set up for the Fence: fencekit's
// table and function (sqlguard.Guard.Check: `fencekit migrate up`),
// River's job table, and the trigger Install creates. It returns nil, or
// every problem found as a *fence.SetupError naming its fix (joined:
// errors.Is(err, fence.ErrSetup) holds), or the database's error when the
// catalog could not be read. It reads the catalog only. ctx bounds the
// reads.
func (f *Fence) Check(ctx context.Context) error {
	var hasTable, hasTrigger bool
	if err := f.db.QueryRow(ctx, checkSQL, f.jobTable).Scan(&hasTable, &hasTrigger); err != nil {
		return fmt.Errorf("riverfence: check: %w", err)
	}
	errs := []error{f.guard.Check(ctx, f.db)}
	switch {
	case !hasTable:
		errs = append(errs, fence.Setup("run River's migrations (rivermigrate, or `river migrate-up`) in "+f.riverWhere()+", or fix Options.RiverSchema",
			"riverfence: check: %w: River's table %s not found", fence.ErrNoTable, f.jobTable))
	case !hasTrigger:
		errs = append(errs, fence.Setup("call Fence.Install once River's tables exist",
			"riverfence: check: %w: river_job has no trigger %s: a superseded attempt's outcome would be recorded on the job", fence.ErrNotMigrated, triggerName))
	}
	return errors.Join(errs...)
}

func (f *Fence) riverWhere() string {
	if f.opts.RiverSchema == "" {
		return "the connection's search_path"
	}
	return "schema " + f.opts.RiverSchema
}
