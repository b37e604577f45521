// Package riverfence fences every attempt of a River job
// (github.com/riverqueue/river, with its pgx v5 driver), so that an attempt
// River has given up on can neither write nor complete the job.
//
// # The failure it closes
//
// River rescues a job whose attempt has run longer than
// RescueStuckJobsAfter: it sets the job retryable, and another worker runs
// it again. The first attempt may not be dead, only paused (a GC, a frozen
// container, a slow network). When it wakes it goes on writing, and when
// it returns River records its outcome on the job's row by the job's id and
// state = 'running' alone: it completes, fails or snoozes the job even
// while the second attempt is running it. JobCompleteTx checks the same two
// things. So both attempts write, and the job ends in whichever state was
// written last.
//
// # The fencing token of an attempt
//
// Fence, a River worker middleware, gives each attempt a fencing token
// before the job's code runs: it mints the next token of the job's resource
// (Resource: "river/job/<id>", one row in sqlguard's table
// fencekit_resource_tokens, the larger of the stored token + 1 and the
// server clock in microseconds) and, in the same statement's transaction,
// reads the job's row and keeps the token only if the row still shows this
// attempt's fetch (state running, the attempt's number and its
// attempted_at). The claim is one call, one round trip, of a function
// Install creates. So
// tokens follow River's own order of attempts: an attempt that River
// fetched later gets a greater token, whatever the order in which the
// processes wake up, and an attempt claims nothing once a later one has
// been fetched.
//
// Why not River's attempt number: it is not a fencing token. A snooze and
// a worker's soft stop hand the number back (attempt - 1), so the next
// fetch repeats it; and a token must be one number that every store can
// compare, not a pair. Why not a fencekit lease per job: its order would be
// the order of acquires, not of River's fetches (a first attempt frozen
// before it acquires would wake up and take a greater token than the
// second), and its TTL would be a second liveness timeout beside River's
// own, to be tuned against it. The job's row already says which attempt is
// current; the token only has to follow it.
//
// # What the job's code gets
//
// The job's context carries the token (fence.FromContext) and the attempt
// (AttemptFrom), and ends, with a *SupersededError as its cause, when the
// attempt is superseded: a later attempt was fetched or claimed a token,
// or River rescued, cancelled or finished the job without this attempt.
// The middleware reads the job's row every WatchInterval to learn it.
//
// Every write presents the token: through sqlguard (a Table write, or a
// transaction advanced on Resource), and through dbguard, blobguard,
// dynamoguard, fencehttp or fencegrpc alike. None of them knows where the
// token came from.
//
// # Completing the job is fenced too
//
// Complete runs the job's last writes and River's JobCompleteTx in one
// transaction advanced on the job's resource with the attempt's token
// (sqlguard.Guard.BeginFunc): a superseded attempt's transaction is
// refused (fence.ErrStaleToken) before its function runs, and one whose
// completion River would apply to another attempt's run is rolled back
// (ErrSuperseded). CompleteTx does the same in a transaction of your own.
// The job's effects and its completion commit together or not at all.
//
// River records the outcome of every attempt when its Work returns,
// whatever the middleware returns, by id and state alone. Install puts a
// trigger on river_job that refuses such a report from an attempt that is
// no longer the row's current fetch: the middleware tags each attempt's
// report with the attempt's identity (job metadata key MetadataKey), and
// the trigger drops the update when that identity is not the row's
// (River logs that the job was changed concurrently and emits no event).
// Check reports a missing trigger.
//
// # What it cannot fence
//
// docs/river.md lists it: River's own decisions (the rescue, by time alone,
// of an attempt that is only paused), the window between a rescue and the
// next attempt's claim, in which the paused attempt still holds the newest
// token, and every write that does not present the token.
package riverfence
