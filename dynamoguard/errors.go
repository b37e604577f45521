package dynamoguard

import (
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

// The guard's errors are fence's, shared by every guard, and two of its
// own below. Bad input is fence.ErrInvalidArgument, refused before any
// I/O: a nil client, an empty table name, the zero token or one above
// 2^63-1 (which also match fence.ErrInvalidToken), a nil item or key, an
// item that sets one of the guard's own attributes, a key that does not
// name exactly the table's key attributes (checked after the probe
// learned them), a transaction of more than 99 items, invalid Options. A
// missing item or a tombstone is a *fence.NotFoundError (its Tombstone is
// the tombstone's token). An item whose version attribute holds something
// other than a number in [1, 2^63-1] is fence.ErrNotFenced: no Guard
// wrote it, so its token is unknown. A table that is not set up (missing,
// access or credentials refused, a server that ignores conditions) is a
// *fence.SetupError that names the fix (fence.ErrNoTable for a missing
// table).
//
// A write's outcome is unknown (fence.ErrOutcomeUnknown) when its request
// was sent and its outcome could not be learned: the context ended or the
// connection broke while it was in flight, the server answered 5xx, a
// transaction was still in progress, or the SDK retried the request and
// the retry failed in a way that does not show which try landed (a stale
// rejection after a retry is returned joined with it: the first try may
// have landed and been replaced). The write may or may not have been
// applied, now or later; it is never reported as success. Read the item
// to learn what is stored.
var (
	// ErrConditionsIgnored is matched (inside a *fence.SetupError, so
	// that it matches fence.ErrSetup and lease.ErrSetup too) by the error
	// of Check, and of every call of a Guard whose probe failed this way,
	// when the server does not honour what the fence rests on: it applied
	// a write whose ConditionExpression was false, did not return the item
	// with a failed condition (ReturnValuesOnConditionCheckFailure), or
	// committed a transaction one of whose conditions was false. Fencing
	// is impossible on such a server, so the guard refuses to run (fail
	// closed).
	ErrConditionsIgnored = errors.New("dynamoguard: server does not honour conditional writes")

	// ErrCanceled is returned (wrapping the SDK's
	// *types.TransactionCanceledException) when a fenced transaction was
	// canceled for a reason other than the fence: one of the caller's own
	// conditions failed, a conflict with another transaction, a
	// validation error. Nothing was written. errors.As gives the
	// exception and its CancellationReasons, in the order of the items
	// passed (the fence's reason is last).
	ErrCanceled = errors.New("dynamoguard: transaction canceled")
)

// conditionsIgnored is the error of a server that does not honour the
// conditions the fence rests on.
func conditionsIgnored(format string, args ...any) error {
	return &fence.SetupError{Err: fmt.Errorf("%w: "+format, append([]any{ErrConditionsIgnored}, args...)...),
		Fix: "use a server that honours condition expressions, ReturnValuesOnConditionCheckFailure and TransactWriteItems (DynamoDB, DynamoDB Local; not dynalite)"}
}
