// Package blobguard makes fenced writes to objects in S3 (or an
// S3-compatible store) through aws-sdk-go-v2 conditional requests: a
// holder whose lease has expired cannot overwrite or delete an object that
// a newer holder wrote, even if it wakes up after a long pause.
//
// # Safety model
//
// A lease gives liveness, never safety (see package fence): safety comes
// from the store refusing writes with an older fencing token than the
// newest it has accepted. S3 has no compare-on-metadata; it has
// If-None-Match: * (create only if absent) and If-Match (replace only if
// the current ETag is the one named), evaluated atomically with the write.
// A Guard turns them into a fence:
//
//   - Put reads the object (its token and ETag), refuses with a
//     *fence.StaleError if the stored token is newer, and otherwise writes
//     conditionally on what it read: If-None-Match: * if there was nothing,
//     If-Match on the ETag if there was. If another write got in between
//     (412), it reads again and decides again.
//   - PutIf is read-modify-write in one request: the caller passes the
//     Version it read (or the one its last write returned), and the guard
//     writes conditionally on it without reading. A Version's fields are
//     unexported and only a Guard makes one, from a write the store
//     acknowledged or a read the guard checked, and for one bucket and
//     key: the token PutIf compares is one the guard knows to be that
//     write's, never one a caller paired with an ETag it learned
//     elsewhere (a plain HeadObject, a listing).
//   - Delete writes a tombstone the same way (see Deletes below).
//
// # The header: why every write's ETag is unique
//
// S3 derives an object's ETag from its bytes alone (the MD5, for a
// single-part upload). Two writes of identical bytes share an ETag, so a
// stale holder whose If-Match names an old write of bytes B would also
// match a newer write of the same bytes B, whatever token the newer write
// kept in its metadata, and would replace it (TestIdenticalBytesShareETag
// shows this on versitygw). Metadata cannot help: no S3 condition looks at
// it. So the guard stores a 30-byte header (HeaderSize) in front of the
// caller's bytes: a magic number, the token and a random 128-bit nonce
// drawn for each write attempt. Every stored write's bytes, and so its
// ETag, are then unique, and If-Match names exactly one write. Get strips
// the header. The token and nonce are also set as user metadata
// (MetaToken, MetaNonce) for people and tools, but the guard trusts only
// the header, which it reads in the same GetObject as the ETag.
//
// Trade-offs, chosen knowingly: other readers see the header (they must use
// Guard.Get, or skip the first HeaderSize bytes); range reads are offset by
// it; the ETag is not the MD5 of the caller's bytes; and the guard refuses
// (fence.ErrNotFenced) to read or replace an object without the header, since its
// token is unknown.
//
// # Ambiguous outcomes and the nonce
//
// A conditional write whose reply is lost may have been applied. The SDK
// retries such a request (a 5xx, a broken connection), and the retry then
// fails with 412 against the caller's own write, or with anything else (a
// 409 from a racing write, a 404, a 403): once the SDK has retried, no
// error says that the write did not land. On every 412, and after
// every write whose outcome is unknown, the guard reads the object again:
// if it holds one of this call's nonces, the write landed and the call
// succeeds; if it holds a state the write was not conditional on, the
// write did not land and never can (ETags are unique per write, so that
// state never comes back). If the call ends while a write's outcome is
// still unknown (the context ends, a newer token is found stored, PutIf's
// version is gone, a request fails outright, or Options.MaxAttempts is
// spent), it returns an error matching fence.ErrOutcomeUnknown and
// fence.ErrOutcomeUnknown (the sentinel both guards share, see package fence),
// joined with the reason (ctx.Err(), the *fence.StaleError, ...): it is
// never reported as success, nor as a clean rejection. A call that fails
// before sending anything, or whose every write was refused, never
// matches it. 409 ConditionalRequestConflict is retried
// after a full-jitter exponential backoff (Options.MinBackoff and
// MaxBackoff), up to Options.MaxAttempts writes per call; 404 on If-Match
// (the object vanished) is decided again from a fresh read.
//
// # Deletes
//
// Delete does not call DeleteObject. It replaces the object with a
// tombstone: a header-only object that keeps the deleter's token (and the
// metadata fencekit-deleted: true). Get reports fence.ErrNotFound; a holder with
// an older token can neither delete a newer object nor bring the key back
// afterwards, which an actual delete could not prevent (once the object is
// gone its token is forgotten, and If-None-Match: * lets anyone create it
// again). A conditional DeleteObject is also unsafe on versitygw v1.8.0:
// its posix backend checks DeleteObject's If-Match outside the lock that
// makes conditional PutObject atomic, so a delete can remove a write that
// landed between its check and its removal. Tombstones cost one small
// object per deleted key and show up in listings.
//
// # Fail closed
//
// Some S3-compatible stores accept If-Match and If-None-Match and ignore
// them. Before its first call a Guard checks the store (Check, the
// start-up check to run when the program starts) and, if the store
// accepts a write whose precondition fails, refuses every call with
// ErrPreconditionsIgnored. The check also finds a missing bucket and
// refused access or credentials, and learns whether the store's ETags are
// the MD5 of the stored bytes. Each problem is a *fence.SetupError naming
// the fix, which matches lease.ErrSetup (it is fence.ErrSetup).
//
// # Errors and metrics
//
// The errors are package fence's, the same for every guard (a
// *fence.StaleError, fence.ErrOutcomeUnknown, a *fence.NotFoundError,
// fence.ErrNotFenced, fence.ErrInvalidArgument, a *fence.SetupError), and
// blobguard's own ErrConflict, ErrContention, ErrETagMismatch and
// ErrPreconditionsIgnored. WithObserver reports each Put, PutIf and Delete
// as a fence.WriteEvent, the input of packages leaseprom and leaseotel.
//
// # Torn reads
//
// A read racing a write can return the ETag of one write with the bytes of
// another. The dangerous pairing is a newer write's ETag with an older
// write's header: a writer whose token lies between the two would pass
// the stale check on the older token and then replace the newer write,
// which its If-Match names. The opposite pairing (an older ETag with a
// newer header) is harmless: the stale check sees the newer token, and an
// If-Match on an ETag that is no longer stored fails and is read again.
//
// By default the guard reads whole objects before it writes, and on a
// store with MD5 ETags checks the ETag against the bytes and reads again
// on a mismatch, so the token it acts on belongs to the write its If-Match
// names whatever the store does. That read costs a transfer of the whole
// object. Options.HeaderReads reads only the header instead (a ranged
// GetObject of HeaderSize bytes), at a cost that does not grow with the
// object, on stores that never make the dangerous pairing: AWS S3, and
// versitygw's posix backend with its default metadata (TestHeaderReadPairing
// checks this on the test server). versitygw with --sidecar does make it,
// in about 3% of reads racing a write (measured); keep the default there.
// HeadObject is never used: versitygw's reads the metadata before the
// ETag, each by path, and makes the dangerous pairing (measured: about 2
// in 1,000 racing reads, on the default backend too). Get always reads
// the whole object and checks it.
//
// # The guarantee
//
// For each key, the tokens of the writes the store applies through any
// number of Guards (Put, PutIf and Delete, from any number of processes)
// never decrease. So a write presenting token t is applied only if no token
// newer than t was stored before it; a write refused with a
// *fence.StaleError changed nothing; and once token t is stored, no write
// with an older token is ever applied to that key again, deletes included.
// This holds whatever the bodies are, identical bytes included. A nil
// error means the write was applied (acknowledged by the store, or its
// nonce found stored); the returned Version is that write's.
//
// It rests on these conditions:
//
//   - The store applies If-None-Match: * and If-Match on PutObject
//     atomically. The probe checks that preconditions are honoured, not
//     that they are atomic under concurrency: versitygw v1.8.0 and later
//     are (earlier releases let racing writers both win), as is AWS S3.
//   - Guarded keys are written only through Guards: a plain PutObject,
//     CopyObject, DeleteObject, a lifecycle expiration or a version restore
//     on such a key is outside the fence (the guard refuses objects it did
//     not write, but a removed tombstone forgets its token).
//   - A read returns the ETag and the bytes of the same write, or the
//     store's ETags are MD5 (then the guard checks it itself). With
//     Options.HeaderReads instead: a GetObject never returns a write's
//     ETag with bytes older than that write (see Torn reads).
//   - Tokens for one key come from one source that only grows them, and
//     no two holders share a token (equal tokens are the same holder
//     writing again and are not ordered against each other).
//
// Not guaranteed: reads are not fenced (a stale holder can still read);
// objects larger than Options.MaxObjectSize (default 64 MiB, at most 5 GiB)
// are not supported, as bodies are held in memory and written in one
// PutObject; in a versioned bucket the guarantee covers the current
// version only.
//
// # Costs
//
// Put and Delete send one GetObject and one PutObject; PutIf sends one
// PutObject; a lost race adds one GetObject and one PutObject per retry.
// The GetObject transfers the whole object, and the guard computes its
// MD5 on stores with MD5 ETags, unless Options.HeaderReads is set: then
// it transfers HeaderSize bytes. Measured against versitygw on loopback,
// paired with plain PutObject calls (BenchmarkPutPaired; docs/blobguard.md
// has the table): a cold Put of 1 MiB costs 1.5–1.7x a plain put by
// default and 1.1–1.35x with HeaderReads; PutIf costs what a plain put
// does. The first call of a Guard also runs the probe (five PutObject and
// two DeleteObject calls).
package blobguard
