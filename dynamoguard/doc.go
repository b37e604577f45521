// Package dynamoguard makes fenced writes to items of a DynamoDB table
// through aws-sdk-go-v2 conditional writes: a holder whose lease has
// expired cannot overwrite, update or delete an item that a newer holder
// wrote, even if it wakes up after a long pause.
//
// # Safety model
//
// A lease gives liveness, never safety (see package fence): safety comes
// from the store refusing writes with an older fencing token than the
// newest it has accepted (Kleppmann, "How to do distributed locking",
// 2016). DynamoDB evaluates a write's ConditionExpression atomically with
// the write, on the item's current state (Amazon DynamoDB Developer Guide,
// "Condition expressions" and "Conditional writes"). Every guarded item
// carries its newest accepted token in a number attribute, lock_version,
// and each write of a Guard is one request whose condition is
// "lock_version is missing or not newer than my token":
//
//   - Put replaces (or creates) an item: one PutItem.
//   - Update changes an existing item with the caller's update expression
//     (an expression.UpdateBuilder): one UpdateItem, whose condition also
//     requires the item to exist and not be a tombstone, so that a missing
//     item (fence.ErrNotFound) is told apart from a stale token in the same
//     request.
//   - Delete leaves a tombstone that keeps the token (see Deletes).
//   - Transact runs the caller's TransactWriteItems actions (up to 99, on
//     any tables) together with an Update of a fence item that checks and
//     advances its token: all are applied or none (Developer Guide,
//     "Amazon DynamoDB Transactions"; API Reference, TransactWriteItems).
//
// A rejected write is answered with ConditionalCheckFailedException (or a
// TransactionCanceledException whose reason for the fence is
// ConditionalCheckFailed). The guard asks for the item as it was with
// ReturnValuesOnConditionCheckFailure=ALL_OLD (API Reference, PutItem,
// UpdateItem, Update), so the *fence.StaleError names the token that beat
// it from the same request, without a second round trip.
//
// # Retries and ambiguous outcomes
//
// The SDK retries a request whose reply was lost (a reset connection, a
// 5xx, throttling). A retry of a conditional write that was applied finds
// its own token stored and, with an equal token allowed, would apply the
// write again: harmless for a Put, wrong for an Update that adds to a
// counter. So every write also stores a random nonce (lock_nonce), and its
// condition requires the stored nonce to differ from its own: a retry of
// an applied write fails its condition, the returned item shows the
// write's nonce, and the guard reports success (TestRetriedUpdateAppliesOnce
// shows the ADD applied once). A transaction carries a random
// ClientRequestToken instead, which DynamoDB uses to make a retry of a
// committed transaction succeed without applying it again (for 10
// minutes; API Reference, TransactWriteItems).
//
// A write whose request was sent and whose answer never came (the context
// ended, the connection broke, a 5xx, TransactionInProgressException, or
// an SDK retry that failed in a way that does not show which try landed)
// returns an error matching fence.ErrOutcomeUnknown and fence.ErrOutcomeUnknown: it
// may have been applied, now or later. A stale rejection after a retry is
// returned joined with fence.ErrOutcomeUnknown: the first try may have landed and
// been replaced by the newer holder. A request that was never sent (a
// signing error, a dial that failed before the SDK's first attempt) is a
// plain error. The guard counts the SDK's attempts with a middleware at
// the end of its Finalize step, inside the retry loop.
//
// # Deletes
//
// Delete does not call DeleteItem: a deleted item forgets its token, and a
// stale holder's Put (lock_version missing) could then bring it back. It
// writes a tombstone instead: the key, the token and lock_deleted = true.
// Get and Update report fence.ErrNotFound for it; Put with a token at least the
// tombstone's replaces it. Tombstones cost one small item per deleted key;
// remove them (a DynamoDB TTL attribute, a sweep) only when no holder of
// an older token can still be running.
//
// # Fail closed
//
// Before its first call a Guard checks the server (Check, the start-up
// check to run when the program starts): a write whose condition is false
// must be refused and the item returned with it, and a transaction with a
// false condition must commit nothing. A server that fails (dynalite, for
// one, ignores ReturnValuesOnConditionCheckFailure and has no
// TransactWriteItems) is refused with ErrConditionsIgnored. The check also
// finds a missing table and refused access or credentials. Each problem is
// a *fence.SetupError naming the fix, which matches lease.ErrSetup (it is
// fence.ErrSetup).
//
// # Errors, metrics, ledger
//
// The errors are package fence's, the same for every guard (a
// *fence.StaleError, fence.ErrOutcomeUnknown, a *fence.NotFoundError,
// fence.ErrNotFenced, fence.ErrInvalidArgument, a *fence.SetupError), and
// dynamoguard's own ErrCanceled and ErrConditionsIgnored. WithObserver
// reports each Put, Update, Delete and Transact as a fence.WriteEvent, the
// input of packages leaseprom and leaseotel. Ledger is a lease.Ledger for
// lease.Manager.RunOnce in a table keyed by job and run_key
// (LedgerTableInput); its MarkDoneTransact records a run done in one
// transaction with the job's own items.
//
// # The guarantee
//
// For each item, the tokens of the writes applied through any number of
// Guards (from any number of processes) never decrease. A write refused
// with a *fence.StaleError changed nothing; once token t is stored, no
// write with an older token is applied to that item again, deletes
// included. A nil error means the write was applied.
//
// It rests on these conditions:
//
//   - The server evaluates conditions atomically with the write, and
//     transactions are all-or-nothing (DynamoDB does; the probe checks
//     that conditions and ALL_OLD are honoured, not atomicity under
//     concurrency, which the conformance suite's concurrent writers
//     exercise on DynamoDB Local).
//   - Guarded items are written only through Guards: a plain PutItem,
//     UpdateItem or DeleteItem on such an item is outside the fence, and
//     one that writes lock_version, lock_nonce or lock_deleted is the
//     caller's bug. A table restored from a backup or point-in-time
//     recovery brings back older tokens.
//   - Tokens for one item come from one source that only grows them, and
//     no two holders share a token. Tokens are at most 2^63-1.
//
// Not guaranteed: reads are not fenced (a stale holder can still read);
// global tables replicate with last-writer-wins between Regions, so a
// condition is checked only against the Region's own copy: fence writes
// in one Region.
//
// # Tests and their limits
//
// The tests run against Amazon's DynamoDB Local 1.25.1 (in memory, started
// by scripts/services.sh), which evaluates conditions, ALL_OLD and
// transactions as the service does. They cannot show DynamoDB's capacity
// limits, throttling (ProvisionedThroughputExceededException is retried
// by the SDK, and then counts as a retry above), transaction conflicts
// under heavy contention, or global tables.
//
// # Costs
//
// Put, Update and Delete send one request each and write the item's own
// size plus lock_version and lock_nonce (about 45 bytes); Transact adds one
// action to the transaction. The first call of a Guard also runs the probe
// (a DescribeTable, two PutItem, a TransactWriteItems, a GetItem and two
// DeleteItem calls).
package dynamoguard
