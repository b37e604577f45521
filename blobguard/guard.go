package blobguard

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/awsattempt"
	"github.com/fencekit/fencekit/internal/options"
	"github.com/fencekit/fencekit/internal/probeonce"
)

// Client is the part of *s3.Client a Guard uses: only the operations it
// calls, with the SDK's per-call option functions. *s3.Client satisfies it,
// and so can a wrapper that injects faults or counts calls. A Guard passes
// option functions that must be applied (as *s3.Client does) for it to tell
// a request that was never sent from one whose outcome is unknown; if they
// are ignored, every transport error is treated as an unknown outcome.
// DeleteObject is used only to remove the probe's own scratch objects.
type Client interface {
	GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error)
	PutObject(ctx context.Context, in *s3.PutObjectInput, optFns ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, optFns ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
}

var _ Client = (*s3.Client)(nil)

// Version identifies one stored write of one object: its ETag and the
// fencing token it carries. PutIf trusts a Version's token without reading
// the object, so only a Guard makes one, from a write the store
// acknowledged or from a read it checked: Get, Put, PutIf and Delete
// return them, and TombstoneOf gives a tombstone's. Its fields are
// unexported, so a caller cannot pair an ETag it learned elsewhere (a
// plain HeadObject, a listing) with a token of its choosing. The zero
// Version names no write: passed to PutIf it means "no live object".
// Versions are comparable with ==.
type Version struct {
	bucket, key string // the object the write belongs to ("" in the zero Version)
	etag        string // the store's entity tag of the write, as returned (quoted)
	token       fence.Token
}

// ETag returns the store's entity tag of the write, as the store returned
// it (quoted). Thanks to the per-write nonce it names this write only. It
// is "" for the zero Version.
func (v Version) ETag() string { return v.etag }

// Token returns the fencing token the write carried, or fence.None for the
// zero Version.
func (v Version) Token() fence.Token { return v.token }

// IsZero reports whether v is the zero Version, which names no write.
func (v Version) IsZero() bool { return v == Version{} }

// Object is an object read by Get: the caller's bytes (without the guard's
// header) and the version they belong to.
type Object struct {
	Version
	Body []byte
}

// Options configure a Guard; set them with Option values passed to New.
// The zero value of each field means its default.
type Options struct {
	// MaxAttempts bounds the conditional PutObject requests one Put, PutIf
	// or Delete sends (SDK retries of one request are not counted; they
	// follow the client's own retry settings). Default 10.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the full-jitter exponential backoff
	// slept after a 409 ConditionalRequestConflict, or after a write whose
	// outcome was unknown, before trying again. Defaults 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// MaxObjectSize is the largest body, in bytes, that Put and PutIf
	// accept and Get reads (and, without HeaderReads, the largest object
	// Put, PutIf and Delete read before replacing it); the whole body is
	// held in memory. Default 64 MiB; at most 5 GiB minus HeaderSize (S3's
	// limit for one PutObject).
	MaxObjectSize int64
	// ProbePrefix is the key prefix under which Probe writes and then
	// deletes two scratch objects. Default ".fencekit-probe/".
	ProbePrefix string
	// HeaderReads makes Put and Delete (and PutIf after a failed
	// condition) read only the HeaderSize bytes of the stored object's
	// header, with a ranged GetObject, to learn its token and ETag, so
	// that a write costs the same whatever the size of the object it
	// replaces. Default false: they read the whole object and, on a store
	// whose ETags are MD5 (see Check), check the ETag against the bytes,
	// reading again on a mismatch.
	//
	// Set it only for a store whose GetObject never returns the ETag of a
	// write together with bytes older than that write (a newer header
	// with an older ETag is harmless: the write's If-Match then fails and
	// the guard reads again). The guard cannot check this from a header,
	// and on a store that does pair an ETag with older bytes a stale
	// holder's Put could replace a newer write. Stores, as found by
	// reading their code and by TestHeaderReadPairing:
	//
	//   - AWS S3: safe (reads are strongly consistent; a GET serves one
	//     object version's bytes and ETag).
	//   - versitygw v1.8.0, posix backend with its default extended-
	//     attribute metadata: safe. Each file carries its own ETag and
	//     metadata and is swapped in whole; GetObject reads the ETag by
	//     path and then opens the file, so a racing write can only give
	//     an older ETag with newer bytes.
	//   - versitygw posix with --sidecar: NOT safe. It stores the ETag and
	//     metadata beside the object before it moves the new bytes into
	//     place, and about 3% of ranged reads racing a write returned the
	//     new ETag with the old header; keep the default (the MD5 check
	//     catches it).
	//   - Any store not listed: keep the default unless you know.
	//
	// HeadObject is not used in either mode: on versitygw it reads the
	// metadata before the ETag, each by path, so it can pair an older
	// write's token with a newer write's ETag.
	HeaderReads bool

	// Observer, when set, receives a fence.WriteEvent for every Put, PutIf
	// and Delete (Guard "blobguard", Class the bucket, Op "put", "put-if"
	// or "delete"), after its outcome is known. Default: none.
	Observer fence.WriteObserver
}

// Option changes Options. Pass any number to New; to set several fields
// at once, pass a function literal: func(o *blobguard.Options) { ... }.
type Option func(*Options)

// WithMaxAttempts sets Options.MaxAttempts, the most conditional writes one
// Put, PutIf or Delete sends (0: the default, 10; below 0 is refused).
func WithMaxAttempts(n int) Option { return func(o *Options) { o.MaxAttempts = n } }

// WithBackoff sets Options.MinBackoff and Options.MaxBackoff, the bounds of
// the backoff after a 409 or an unknown outcome (0: the defaults, 10ms and
// 1s; minBackoff below 0, or maxBackoff below minBackoff, is refused).
func WithBackoff(minBackoff, maxBackoff time.Duration) Option {
	return func(o *Options) { o.MinBackoff, o.MaxBackoff = minBackoff, maxBackoff }
}

// WithMaxObjectSize sets Options.MaxObjectSize, in bytes (0: the default,
// 64 MiB; below 0 or above 5 GiB minus HeaderSize is refused).
func WithMaxObjectSize(n int64) Option { return func(o *Options) { o.MaxObjectSize = n } }

// WithProbePrefix sets Options.ProbePrefix, the key prefix of the probe's
// scratch objects ("": the default, ".fencekit-probe/"; a prefix that does
// not make valid keys is refused).
func WithProbePrefix(prefix string) Option { return func(o *Options) { o.ProbePrefix = prefix } }

// WithHeaderReads sets Options.HeaderReads: Put and Delete read only the
// stored object's header. Read that field's documentation first: it is
// safe only on some stores.
func WithHeaderReads() Option { return func(o *Options) { o.HeaderReads = true } }

// WithObserver sets Options.Observer.
func WithObserver(o fence.WriteObserver) Option { return func(opts *Options) { opts.Observer = o } }

// Defaults of Options.
const (
	DefaultMaxAttempts   = 10
	DefaultMinBackoff    = 10 * time.Millisecond
	DefaultMaxBackoff    = time.Second
	DefaultMaxObjectSize = 64 << 20
	DefaultProbePrefix   = ".fencekit-probe/"

	maxPutSize = 5<<30 - headerLen
)

func (o *Options) setDefaults() {
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxObjectSize == 0 {
		o.MaxObjectSize = DefaultMaxObjectSize
	}
	if o.ProbePrefix == "" {
		o.ProbePrefix = DefaultProbePrefix
	}
}

func (o *Options) validate() error {
	var errs []error
	if o.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("%w: MaxAttempts %d < 1", fence.ErrInvalidArgument, o.MaxAttempts))
	}
	if o.MinBackoff < 0 {
		errs = append(errs, fmt.Errorf("%w: MinBackoff %v < 0", fence.ErrInvalidArgument, o.MinBackoff))
	}
	if o.MaxBackoff < o.MinBackoff {
		errs = append(errs, fmt.Errorf("%w: MaxBackoff %v < MinBackoff %v", fence.ErrInvalidArgument, o.MaxBackoff, o.MinBackoff))
	}
	if o.MaxObjectSize < 0 || o.MaxObjectSize > maxPutSize {
		errs = append(errs, fmt.Errorf("%w: MaxObjectSize %d not in [0, %d]", fence.ErrInvalidArgument, o.MaxObjectSize, int64(maxPutSize)))
	}
	// The probe appends 32 hex digits to the prefix.
	if err := validateKey(o.ProbePrefix + "0123456789abcdef0123456789abcdef"); err != nil {
		errs = append(errs, fmt.Errorf("ProbePrefix: %w", err))
	}
	return errors.Join(errs...)
}

// Guard makes fenced writes to the objects of one bucket. It is safe for
// concurrent use. Create it with New.
type Guard struct {
	client Client
	bucket string
	opts   Options

	gate     probeonce.Gate // the probe's verdict
	mu       sync.Mutex     // guards md5ETags
	md5ETags bool           // the store's ETags are MD5 of the stored bytes
}

// New returns a Guard for bucket over client, configured by opts (applied
// in order; a nil Option is skipped). It does no I/O: the store is probed
// (see Check) before the first Get, Put, PutIf or Delete. It returns an
// error wrapping fence.ErrInvalidArgument for a nil client, a malformed bucket name
// or invalid options, reporting every problem at once.
func New(client Client, bucket string, opts ...Option) (*Guard, error) {
	o := options.Apply(opts)
	o.setDefaults()
	var errs []error
	if client == nil || isNilS3Client(client) {
		errs = append(errs, fmt.Errorf("%w: nil client", fence.ErrInvalidArgument))
	}
	if err := validateBucket(bucket); err != nil {
		errs = append(errs, err)
	}
	if err := o.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Guard{client: client, bucket: bucket, opts: o}, nil
}

func isNilS3Client(c Client) bool {
	sc, ok := c.(*s3.Client)
	return ok && sc == nil
}

// Options returns the options the Guard runs with, defaults filled in.
func (g *Guard) Options() Options { return g.opts }

// Bucket returns the bucket the guard writes to.
func (g *Guard) Bucket() string { return g.bucket }

func (g *Guard) resource(key string) string { return "s3://" + g.bucket + "/" + key }

// version makes the Version of the write of key with etag and token. The
// guard calls it only with what the store acknowledged for its own write,
// or with the ETag and header token of a read it checked.
func (g *Guard) version(key, etag string, token fence.Token) Version {
	return Version{bucket: g.bucket, key: key, etag: etag, token: token}
}

// Get reads the object at key: its bytes, its token and its ETag. ctx
// bounds the whole call (including the probe on first use). It returns a
// *fence.NotFoundError (matching fence.ErrNotFound) when there is no object or a
// tombstone (TombstoneOf gives its Version), and an error wrapping fence.ErrNotFenced for an object that was not
// written by a Guard.
func (g *Guard) Get(ctx context.Context, key string) (*Object, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if err := g.ensureProbed(ctx); err != nil {
		return nil, err
	}
	cur, err := g.read(ctx, key, false)
	if err != nil {
		return nil, err
	}
	if !cur.exists || cur.deleted {
		nf := &fence.NotFoundError{Resource: g.resource(key)}
		if cur.exists {
			v := g.version(key, cur.etag, cur.header.token)
			nf.Tombstone, nf.Version = v.token, v
		}
		return nil, fmt.Errorf("blobguard: get: %w", nf)
	}
	return &Object{Version: g.version(key, cur.etag, cur.header.token), Body: cur.payload}, nil
}

// Put writes body to key with token, unless a newer token is stored there.
// It reads the current object (one GetObject: of the whole object, or of
// its header only with Options.HeaderReads) and writes conditionally on it
// (one PutObject: If-None-Match: * to create, If-Match on the read ETag to
// replace). If another write got in between, it reads again and, while
// the stored token is not newer than token, tries again, up to
// Options.MaxAttempts writes. A write with a token equal to the stored one
// succeeds (the same holder writing again). Put replaces a tombstone.
//
// It returns the new Version on success; a *fence.StaleError (matching
// fence.ErrStaleToken) with the stored token when a newer token is stored,
// in which case nothing was written; an error matching fence.ErrOutcomeUnknown and
// fence.ErrOutcomeUnknown when a write's outcome could not be learned;
// ErrContention when every attempt lost; fence.ErrNotFenced when the key holds
// an object no Guard wrote; ErrETagMismatch when whole-object reads kept
// returning an ETag that does not match their bytes; fence.ErrInvalidArgument,
// before any I/O, for a bad key, token or body (and, reading whole
// objects, for a stored object larger than Options.MaxObjectSize); and the
// probe's ErrPreconditionsIgnored. body is read to its end before any I/O
// (at most Options.MaxObjectSize bytes). ctx bounds the whole call,
// including the probe on first use, retries and backoff.
func (g *Guard) Put(ctx context.Context, key string, token fence.Token, body io.Reader) (Version, error) {
	if g.opts.Observer == nil {
		return g.put(ctx, key, token, body)
	}
	e := g.event(ctx, "put", key, token)
	v, err := g.put(ctx, key, token, body)
	return v, fence.ObserveWrite(g.opts.Observer, e, err)
}

// event starts the fence.WriteEvent of one write.
func (g *Guard) event(ctx context.Context, op, key string, token fence.Token) fence.WriteEvent {
	return fence.WriteEvent{Ctx: ctx, Guard: "blobguard", Class: g.bucket, Op: op, Resource: g.resource(key), Token: token, Start: time.Now()}
}

func (g *Guard) put(ctx context.Context, key string, token fence.Token, body io.Reader) (Version, error) {
	env, err := g.checkWrite(key, token, body)
	if err != nil {
		return Version{}, err
	}
	return g.write(ctx, writeReq{key: key, token: token, env: env})
}

// PutIf is a compare-and-swap for read-modify-write: it writes body to key
// with token only if the object is still the version prev (a Version of
// this key from Get, Put, PutIf or Delete, of this or another Guard of the
// same bucket; the zero Version, or a tombstone's (TombstoneOf), means "no
// live object"). In the common case it sends one request and no read: it
// writes If-Match on prev's ETag, and the token it checks is the one the
// guard recorded in prev when it made it, never one the caller supplies.
// It returns an error wrapping fence.ErrInvalidArgument, before any I/O, if prev is
// a version of another bucket or key; a *fence.StaleError without any I/O
// if prev.Token() is newer than token; and after a failed condition either
// a *fence.StaleError (a newer token is stored) or ErrConflict (the object
// changed but no newer token is stored). Other errors are as for Put.
func (g *Guard) PutIf(ctx context.Context, key string, token fence.Token, body io.Reader, prev Version) (Version, error) {
	if g.opts.Observer == nil {
		return g.putIf(ctx, key, token, body, prev)
	}
	e := g.event(ctx, "put-if", key, token)
	v, err := g.putIf(ctx, key, token, body, prev)
	return v, fence.ObserveWrite(g.opts.Observer, e, err)
}

func (g *Guard) putIf(ctx context.Context, key string, token fence.Token, body io.Reader, prev Version) (Version, error) {
	env, err := g.checkWrite(key, token, body)
	if err != nil {
		return Version{}, err
	}
	if !prev.IsZero() && (prev.bucket != g.bucket || prev.key != key) {
		return Version{}, fmt.Errorf("%w: prev is a version of s3://%s/%s, not of %s", fence.ErrInvalidArgument, prev.bucket, prev.key, g.resource(key))
	}
	if prev.token > token {
		return Version{}, fence.Stale(g.resource(key), token, prev.token)
	}
	return g.write(ctx, writeReq{key: key, token: token, env: env, cas: true, prev: prev})
}

// Delete removes the object at key on behalf of token, unless a newer token
// is stored there: it replaces the object with a tombstone (a header-only
// object, HeaderSize bytes, with metadata fencekit-deleted: true) that
// keeps the token, so that Get reports fence.ErrNotFound and a stale holder can
// neither delete a newer object nor bring the key back with an older token
// afterwards. Deleting a missing key writes a tombstone too. It works and
// fails like Put and returns the tombstone's Version. The store's
// DeleteObject is not used: see the package documentation.
func (g *Guard) Delete(ctx context.Context, key string, token fence.Token) (Version, error) {
	if g.opts.Observer == nil {
		return g.delete(ctx, key, token)
	}
	e := g.event(ctx, "delete", key, token)
	v, err := g.delete(ctx, key, token)
	return v, fence.ObserveWrite(g.opts.Observer, e, err)
}

func (g *Guard) delete(ctx context.Context, key string, token fence.Token) (Version, error) {
	if err := validateKey(key); err != nil {
		return Version{}, err
	}
	if err := validateToken(token); err != nil {
		return Version{}, err
	}
	return g.write(ctx, writeReq{key: key, token: token, env: make([]byte, headerLen), deleted: true})
}

func (g *Guard) checkWrite(key string, token fence.Token, body io.Reader) ([]byte, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if err := validateToken(token); err != nil {
		return nil, err
	}
	if body == nil {
		return nil, fmt.Errorf("%w: nil body", fence.ErrInvalidArgument)
	}
	return readEnvelope(body, g.opts.MaxObjectSize)
}

// readEnvelope reads body to its end into a (pooled) slice that leaves
// room for the header in front: the stored form, but for the header.
func readEnvelope(body io.Reader, max int64) ([]byte, error) {
	size := int64(-1)
	if l, ok := body.(interface{ Len() int }); ok {
		// bytes.Reader, strings.Reader, bytes.Buffer: size it exactly.
		size = int64(l.Len()) + headerLen
	}
	env, err := readAll(io.MultiReader(bytes.NewReader(make([]byte, headerLen)), body), size, max+headerLen, true)
	if errors.Is(err, fence.ErrInvalidArgument) {
		return nil, fmt.Errorf("%w: body larger than MaxObjectSize (%d bytes)", fence.ErrInvalidArgument, max)
	}
	if err != nil {
		return nil, fmt.Errorf("blobguard: read body: %w", err)
	}
	return env, nil
}

type writeReq struct {
	key     string
	token   fence.Token
	env     []byte // header space and the caller's bytes
	deleted bool
	cas     bool    // PutIf: fail with ErrConflict if the object is not prev
	prev    Version // for cas
}

// matchesPrev reports whether s is still the state a PutIf expected.
func (w *writeReq) matchesPrev(s stored) bool {
	if w.prev.IsZero() {
		return !s.exists || s.deleted
	}
	return s.exists && normETag(s.etag) == normETag(w.prev.etag)
}

// write runs the conditional write loop shared by Put, PutIf and Delete.
func (g *Guard) write(ctx context.Context, w writeReq) (Version, error) {
	if err := g.ensureProbed(ctx); err != nil {
		return Version{}, err
	}
	res := g.resource(w.key)
	var (
		cur       stored
		haveCur   bool
		mine      []nonce  // nonces of every write this call sent
		ambiguous error    // an earlier write's outcome is unknown
		pending   []string // the states (normalised ETag, "" = absent) those writes were conditional on
		contended error    // the last write lost to a competitor (412, 409, 404)
	)
	if w.cas {
		// Trust the caller's read: no GetObject before the first write.
		haveCur = true
		cur = stored{exists: !w.prev.IsZero(), etag: w.prev.etag, header: header{token: w.prev.token}}
	}
	for sent := 0; ; {
		if err := ctx.Err(); err != nil {
			return Version{}, withAmbiguous(ambiguous, fmt.Errorf("blobguard: write %s: %w", res, err))
		}
		if !haveCur {
			var err error
			cur, err = g.readForWrite(ctx, w.key)
			if err != nil {
				return Version{}, withAmbiguous(ambiguous, err)
			}
			if cur.exists && containsNonce(mine, cur.header.nonce) {
				// One of our writes landed, even though its reply said
				// otherwise (an SDK retry met our own write: 412).
				return g.version(w.key, g.ownETag(w, cur), w.token), nil
			}
			if cur.exists && cur.header.token > w.token {
				return Version{}, withAmbiguous(ambiguous, fence.Stale(res, w.token, cur.header.token))
			}
			// Not ours, and not newer. A write of ours whose outcome was
			// unknown and that was conditional on another state did not
			// land (had it landed, a later write over it would carry a
			// token at least ours, and a guard's equal-token write is
			// the same holder's), and it never can: ETags are unique
			// per write, so that state never comes back. One that was
			// conditional on this very state may still land, but then
			// every later write of ours fails its condition.
			pending = slices.DeleteFunc(pending, func(e string) bool { return e != stateKey(cur) })
			if len(pending) == 0 {
				ambiguous = nil
			}
			if w.cas && !w.matchesPrev(cur) {
				return Version{}, withAmbiguous(ambiguous, fmt.Errorf("%w: %s: expected ETag %q, found %q (token %d)", ErrConflict, res, w.prev.etag, cur.etag, cur.header.token))
			}
		}
		haveCur = false
		if sent == g.opts.MaxAttempts {
			if ambiguous != nil {
				return Version{}, ambiguous
			}
			return Version{}, fmt.Errorf("%w: %s: %d attempts: %w", ErrContention, res, sent, contended)
		}
		sent++

		n, err := newNonce()
		if err != nil {
			return Version{}, withAmbiguous(ambiguous, err)
		}
		mine = append(mine, n)
		h := header{token: w.token, nonce: n, deleted: w.deleted}
		// The first attempt writes the header into the buffer it was
		// read into; later ones copy it, as the HTTP transport may still
		// be reading an earlier attempt's body after it returned.
		env := w.env
		if sent > 1 {
			env = slices.Clone(w.env)
		}
		putHeader(env, h)

		etag, oc, err := g.putOnce(ctx, w.key, env, h, cur)
		switch oc {
		case written:
			// The store has every byte of env: the transport is done
			// with it. (Buffers of failed requests are left to the GC.)
			putBuf(env)
			return g.version(w.key, etag, w.token), nil
		case retriedPreconditionFailed:
			// The SDK retried: the first try may have been applied and
			// the retry then failed on our own write. The re-read tells.
			ambiguous = fmt.Errorf("%w: write %s: %w", fence.ErrOutcomeUnknown, res, err)
			pending = append(pending, stateKey(cur))
			contended = err
		case preconditionFailed, vanished:
			// Someone else wrote (or the object was removed): re-read.
			contended = err
		case conflict:
			contended = err
			if err := g.sleep(ctx, sent); err != nil {
				return Version{}, withAmbiguous(ambiguous, fmt.Errorf("blobguard: write %s: %w: %w", res, contended, err))
			}
		case unknown:
			ambiguous = fmt.Errorf("%w: write %s: %w", fence.ErrOutcomeUnknown, res, err)
			pending = append(pending, stateKey(cur))
			if err := ctx.Err(); err != nil {
				return Version{}, errors.Join(ambiguous, err)
			}
			if err := g.sleep(ctx, sent); err != nil {
				return Version{}, errors.Join(ambiguous, err)
			}
		default: // failed
			return Version{}, withAmbiguous(ambiguous, err)
		}
	}
}

// ownETag returns the ETag of the write of w that read found stored (its
// nonce is cur's). A header read may pair that header with the ETag of an
// earlier write (see Options.HeaderReads); on a store with MD5 ETags the
// guard knows its write's ETag anyway, the MD5 of the bytes it sent, and
// uses that unless the read agrees.
func (g *Guard) ownETag(w writeReq, cur stored) string {
	g.mu.Lock()
	md5ETags := g.md5ETags
	g.mu.Unlock()
	if !g.opts.HeaderReads || !md5ETags {
		return cur.etag // a full read checked it, or nothing can
	}
	var h [headerLen]byte
	putHeader(h[:], header{token: w.token, nonce: cur.header.nonce, deleted: w.deleted})
	sum := md5.New()
	sum.Write(h[:])
	sum.Write(w.env[headerLen:])
	want := hex.EncodeToString(sum.Sum(nil))
	if normETag(cur.etag) == want {
		return cur.etag
	}
	return `"` + want + `"`
}

func withAmbiguous(ambiguous, err error) error {
	if ambiguous == nil {
		return err
	}
	return errors.Join(ambiguous, err)
}

// stateKey names the state a conditional write was conditional on.
func stateKey(s stored) string {
	if !s.exists {
		return ""
	}
	return normETag(s.etag)
}

func containsNonce(ns []nonce, n nonce) bool {
	for _, m := range ns {
		if m == n {
			return true
		}
	}
	return false
}

type outcome int

const (
	failed                    outcome = iota // definite failure: nothing written
	written                                  // the store acknowledged the write
	preconditionFailed                       // 412 on the only HTTP attempt: someone else wrote
	retriedPreconditionFailed                // 412 after SDK retries: maybe our own first try
	vanished                                 // 404 NoSuchKey on If-Match: the object is gone
	conflict                                 // 409: retry after backoff
	unknown                                  // sent, outcome unknown: re-read to learn it
)

// putOnce sends one conditional PutObject (the SDK may retry it) and
// classifies the result.
func (g *Guard) putOnce(ctx context.Context, key string, env []byte, h header, cur stored) (string, outcome, error) {
	in := &s3.PutObjectInput{
		Bucket:        aws.String(g.bucket),
		Key:           aws.String(key),
		Body:          bytes.NewReader(env),
		ContentLength: aws.Int64(int64(len(env))),
		Metadata:      metadataFor(h),
	}
	if cur.exists {
		in.IfMatch = aws.String(cur.etag)
	} else {
		in.IfNoneMatch = aws.String("*")
	}
	var tr awsattempt.Tracker
	out, err := g.client.PutObject(ctx, in, counted(&tr))
	if err == nil {
		etag := aws.ToString(out.ETag)
		if etag == "" {
			// Applied, but the version is not known: a re-read finds
			// our nonce and its ETag.
			return "", unknown, fmt.Errorf("blobguard: put s3://%s/%s: the store returned no ETag", g.bucket, key)
		}
		return etag, written, nil
	}
	err = fmt.Errorf("blobguard: put s3://%s/%s: %w", g.bucket, key, err)
	status, code := awsattempt.HTTPStatus(err), awsattempt.APICode(err)
	// After an SDK retry (or when the attempts cannot be counted) an
	// earlier try of this request may have been applied, whatever the
	// last one was told: no answer then says the write did not land.
	retried := tr.Retried()
	switch {
	case status == 412 || code == "PreconditionFailed":
		if retried {
			return "", retriedPreconditionFailed, err
		}
		return "", preconditionFailed, err
	case status == 409 && (code == "ConditionalRequestConflict" || code == "OperationAborted" || code == ""):
		if retried {
			return "", unknown, err // back off, then the re-read tells
		}
		return "", conflict, err
	case status == 404 && code == "NoSuchKey":
		if retried {
			return "", retriedPreconditionFailed, err
		}
		return "", vanished, err
	case status >= 500:
		return "", unknown, err
	case status != 0:
		if retried {
			return "", failed, fmt.Errorf("%w: %w", fence.ErrOutcomeUnknown, err)
		}
		return "", failed, g.storeErr(err)
	case tr.NeverSent():
		// No response, and the request never got past signing.
		return "", failed, err
	default:
		return "", unknown, err
	}
}

// sleep waits a full-jitter exponential backoff for the n-th attempt.
func (g *Guard) sleep(ctx context.Context, n int) error {
	d := g.opts.MinBackoff
	for i := 1; i < n && d < g.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, g.opts.MaxBackoff)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(rand.N(d) + 1)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// counted returns the per-call option function that makes tr count the
// call's HTTP attempts (package awsattempt).
func counted(tr *awsattempt.Tracker) func(*s3.Options) {
	return func(o *s3.Options) { tr.Add(&o.APIOptions) }
}
