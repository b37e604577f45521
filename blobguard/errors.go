package blobguard

import (
	"errors"

	"github.com/fencekit/fencekit/fence"
)

// The guard's errors are fence's, shared by every guard, and three of its
// own below. Bad input is fence.ErrInvalidArgument (a nil client or body,
// an empty or malformed bucket name or key, the zero token, which also
// matches fence.ErrInvalidToken, a body over Options.MaxObjectSize,
// invalid Options), refused before any I/O. A missing object or a
// tombstone is a *fence.NotFoundError (TombstoneOf gives the tombstone's
// Version). An object no Guard wrote (no blobguard header, or one this
// version cannot read) is fence.ErrNotFenced: the guard neither returns
// nor overwrites it; remove it by other means to use the key. A store
// that is not set up (the bucket missing, access or credentials refused,
// conditional writes not honoured) is a *fence.SetupError that names the
// fix.
//
// A write's outcome is unknown (fence.ErrOutcomeUnknown) when Put, PutIf
// or Delete sent a conditional PutObject whose outcome they could not
// learn before the call ended: the context ended or the connection broke
// while it was in flight, the store answered 5xx or acknowledged it
// without an ETag, or the SDK retried it and the retry failed in any way
// (412, 409, 404, 403...: the first try may have been applied). The guard
// then reads the object again (except after a retry that failed with an
// error it cannot retry, which it returns as it is, joined with
// fence.ErrOutcomeUnknown): finding the write's nonce makes the call a
// success, and finding the object changed to a state the write was not
// conditional on shows that it did not land and never can. If the call
// ends first, the error matches fence.ErrOutcomeUnknown, joined with the
// reason: ctx.Err() when the context ended; the *fence.StaleError when a
// newer token was found stored (the write may have landed and been
// replaced); ErrConflict when PutIf found another version; the error of a
// read or write that failed outright; or nothing more when
// Options.MaxAttempts was spent (in place of ErrContention). The write may
// or may not have been applied, now or later; it is never reported as
// success. Read the object (Get) to learn what is stored.
var (
	// ErrPreconditionsIgnored is matched (inside a *fence.SetupError, so
	// that it matches fence.ErrSetup and lease.ErrSetup too) by the error
	// of Check, and of every call of a Guard whose probe failed this way,
	// when the store does not honour S3 conditional writes: it accepted a
	// conditional create of an existing key, a write with a wrong
	// If-Match, or an If-Match on a missing key, or it refused a write
	// whose If-Match held. Fencing is impossible on such a store, so the
	// guard refuses to run (fail closed).
	ErrPreconditionsIgnored = errors.New("blobguard: store does not honour conditional writes")

	// ErrConflict is returned by PutIf when the object is no longer the
	// version the caller read, and no newer token is stored: someone with
	// an older or equal token wrote in between. Read it again and retry.
	ErrConflict = errors.New("blobguard: object changed since it was read")

	// ErrContention is returned when Options.MaxAttempts conditional writes
	// all lost to competing writers with older or equal tokens, or met
	// 409 ConditionalRequestConflict. Nothing was written by this call.
	ErrContention = errors.New("blobguard: too many conflicting writes")

	// ErrETagMismatch is returned when the store keeps MD5 ETags (found by
	// the probe) but returned an ETag that is not the MD5 of the bytes it
	// returned with it, again on every re-read: a torn or corrupt read.
	ErrETagMismatch = errors.New("blobguard: store returned an ETag that does not match the object")
)

// TombstoneOf returns the Version of the tombstone that the
// *fence.NotFoundError in err's chain names (Get's answer for a key that
// Delete left a tombstone at), and whether there is one. The zero Version
// (no object at all) and a tombstone's can both be passed to PutIf as
// prev; a tombstone's creates the object in one request.
func TombstoneOf(err error) (Version, bool) {
	var nf *fence.NotFoundError
	if !errors.As(err, &nf) {
		return Version{}, false
	}
	v, ok := nf.Version.(Version)
	return v, ok && !v.IsZero()
}
