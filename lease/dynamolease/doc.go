// Package dynamolease is a driver.Backend on Amazon DynamoDB: one item per
// lease name, and each of Acquire, Renew and Release one conditional
// UpdateItem, with the fencing token minted in the same request as the
// grant. Pair it with dynamoguard (or any guard) to have the token
// enforced where the work writes.
//
// # The table
//
// A table with a string partition key, Options.KeyAttribute ("name" by
// default), and no sort key: CreateTable makes one (on-demand billing), or
//
//	aws dynamodb create-table --table-name leases \
//	  --attribute-definitions AttributeName=name,AttributeType=S \
//	  --key-schema AttributeName=name,KeyType=HASH --billing-mode PAY_PER_REQUEST
//
// Check (and lease.Manager.Check) returns a *driver.SetupError naming this
// fix when the table is missing or keyed otherwise. The backend needs
// dynamodb:UpdateItem, GetItem and DescribeTable on it.
//
// The item of a lease holds token (N, the last token granted for the
// name), owner (S, absent while the lease is free), rvn (S, a record
// version: random, new on every grant, renewal and release), ttl_ms (N, the
// current grant's TTL in milliseconds), and one "ended:<owner>" map per
// recently ended owner. The item is never deleted: a release removes the
// owner and keeps the token.
//
// # Time: the record-version rule
//
// DynamoDB has no server clock that a condition can read, so the store
// cannot tell that a grant expired, and the backend does not trust another
// host's wall clock to tell it either. It follows the rule of Amazon's
// DynamoDB Lock Client (awslabs/amazon-dynamodb-lock-client; its Go port,
// cirello.io/dynamolock): a waiter may take a held lease only after it has
// seen the same record version, unchanged, for the whole TTL the item
// carries, measured on its own monotonic clock from the reply that first
// showed it; the takeover is conditional on that record version, so a
// renewal in between (a new version) makes it fail and starts the wait
// again. A Backend keeps these observations in memory, per lease name.
//
// This keeps invariant 1 of docs/design.md (exclusive). The holder's lease is
// valid until its local deadline: the send time of its last successful
// acquire or renew request + TTL − the Manager's safety margin. That
// request wrote the record version the waiter saw, so it was sent before
// the waiter's reply arrived; the waiter's takeover is sent at least a
// TTL after that reply, hence after the holder's deadline, as long as
// the two hosts' monotonic clocks run at rates within the safety margin
// (lease.Options.SafetyMargin); wall clocks play no part. The price is
// liveness: a crashed holder's lease is taken one TTL after a waiter
// first looks at it (not one TTL after the crash), and a backend that
// joins late waits a full TTL. A released lease is taken at once.
//
// # Tokens
//
// The grant's UpdateItem sets token = if_not_exists(token, floor) + 1, so
// the token grows by one with every grant of the name, in the same request
// (invariant 2). floor is the granting host's wall clock in microseconds,
// used only when the item has no token: a new name, or a table that lost
// its items (deleted and re-created, emptied by hand). Tokens issued
// before the loss were the floor at the name's first grant plus the
// number of grants since, so the floor is above them as long as the
// granting host's clock is not behind by more than the time since those
// grants began, and a name was granted less than once per microsecond on
// average (TestConformance/TokensGrowAfterDataLoss). A table restored from
// a backup or point-in-time recovery is not covered: its items carry the
// older tokens of the backup, and holders of newer tokens can still be
// running; after a restore, and before leases are taken again, raise
// every item's token above the newest one handed out with RaiseTokens
// (TestRestoreThenRaiseTokens). Tokens start near the clock in
// microseconds since 1970 (about 1.8e15 in 2026): below 2^53, and below
// 2^63 for the guards.
//
// # Ended owners
//
// Release and Abandon record the owner they end (and a Release that finds
// the grant lost records it as lost) in the item, as driver.Backend
// requires, and Acquire is conditional on the owner not being recorded, so
// a late acquire request of an attempt nobody waits for is refused. A
// record is kept at least driver.EndedOwnerTTL of the lease's TTL; a later
// Acquire of the name removes records older than that plus
// Options.PruneAfter (1 minute by default), judged by the writer's and the
// pruner's wall clocks: a pruner whose clock is ahead by more than
// PruneAfter removes them early.
//
// # Operating leases
//
// Revoke (driver.Revoker) is one UpdateItem conditional on the item naming
// the owner with the token: it removes the owner and records it as lost,
// so the name is free at once and the next grant's token is greater.
// Status (driver.Lister) is Holder's read; List scans the table (ScanAPI;
// its cost grows with the table, not with the result).
//
// # Errors
//
// Acquire returns a *driver.NotAcquiredError (matching driver.ErrNotAcquired)
// whose RetryAfter is how much of the TTL the backend still has to watch
// the holder's record version, or an error matching driver.ErrNotAcquired
// for an ended owner; Renew and Release an error matching driver.ErrNotHeld
// when the item no longer names the grant's owner and token; every call a
// *driver.SetupError (matching driver.ErrSetup) for a missing table or
// refused credentials, and the SDK's error, wrapped, otherwise. New returns
// ErrInvalidInput for a nil client, an empty table name or bad options.
//
// # What it cannot do
//
// No watch (waiters poll; DynamoDB Streams are a separate service with
// their own lag), no batch renewals, no pushed loss, no waiters in line
// (driver.Limits.Queues, lease.WithFIFO): a waiter's place would need an
// expiry that the store can judge, and DynamoDB has no clock a condition
// can read, so a place could lapse only by the record-version rule above,
// each waiter watching every place ahead of it for a whole TTL (a read
// per place ahead on every attempt, and a TTL lost per dead waiter); not
// built. Conditions are
// checked against one Region's copy: with global tables, use one Region
// for leases. The tests run on DynamoDB Local 1.25.1, which shows neither
// throttling nor capacity limits; a throttled renewal is retried by the
// SDK inside the lease's own deadline, and a lease whose renewals keep
// failing is lost at its local deadline as with any store.
package dynamolease
