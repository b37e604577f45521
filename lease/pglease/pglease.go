package pglease

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/pgleasesql"
	"github.com/fencekit/fencekit/lease/driver"
)

// Pool is the part of a pgx v5 pool the backend uses: statements for table
// mode, and Acquire for the connections it keeps (the listener of release
// notifications, and in session mode one pinned connection per held lease).
// *pgxpool.Pool satisfies it, as does a wrapper that injects faults.
type Pool interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

var (
	_ Pool                = (*pgxpool.Pool)(nil)
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Watcher      = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Checker      = (*Backend)(nil)
)

// Names of the tables the backend uses, created by package migrations
// (fencekit migrate up).
const (
	// LeaseTable holds table mode's leases: one row per name.
	LeaseTable = pgleasesql.LeaseTable
	// SessionLeaseTable holds session mode's last token per name.
	SessionLeaseTable = pgleasesql.SessionLeaseTable
	// WaiterTable and SessionWaiterTable hold each mode's lines of
	// waiters: one row per owner waiting in line for a name
	// (driver.Request.Queue).
	WaiterTable        = pgleasesql.WaiterTable
	SessionWaiterTable = pgleasesql.SessionWaiterTable
	// EndedTable and SessionEndedTable hold the owners each mode ended
	// (Release, Abandon): one row per lease name and owner, which Acquire
	// refuses for driver.EndedOwnerTTL.
	EndedTable        = pgleasesql.EndedTable
	SessionEndedTable = pgleasesql.SessionEndedTable
	// Channel is the LISTEN/NOTIFY channel on which releases are announced;
	// the payload is the lease name.
	Channel = "fencekit_lease_released"
)

// MinTTL is the shortest TTL the backend accepts, in either mode: shorter
// ones leave no room for a renewal round trip.
const MinTTL = 10 * time.Millisecond

// maxSessionTTL is the longest idle_session_timeout PostgreSQL accepts
// (INT_MAX milliseconds).
const maxSessionTTL = (1<<31 - 1) * time.Millisecond

// Mode says how leases are kept; see the package documentation.
type Mode int

const (
	// ModeTable keeps each lease in a row of LeaseTable, with an expiry
	// computed by the server's clock. Every operation is one statement on
	// any connection of the pool, so it works through poolers. The default.
	ModeTable Mode = iota
	// ModeSession keeps each lease as a session-level advisory lock on a
	// connection pinned for the lease's life.
	ModeSession
)

// String returns "table" or "session".
func (m Mode) String() string {
	switch m {
	case ModeTable:
		return "table"
	case ModeSession:
		return "session"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode returns the Mode named "table" or "session".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "table":
		return ModeTable, nil
	case "session":
		return ModeSession, nil
	}
	return 0, fmt.Errorf("%w: unknown mode %q (want table or session)", ErrInvalidOptions, s)
}

var (
	// ErrInvalidOptions is matched by New's error for unusable options; the
	// error lists every problem.
	ErrInvalidOptions = errors.New("pglease: invalid options")
	// ErrClosed is returned by Acquire and Watch after Close.
	ErrClosed = errors.New("pglease: backend closed")
	// ErrNotMigrated is matched by an error of Acquire, Renew or Release
	// when the lease tables do not exist in the schema the backend looks
	// in: run migrations.Up (fencekit migrate up) there, or fix
	// Options.Schema.
	// It also matches driver.ErrSetup, so a blocking Acquire returns it at
	// once.
	ErrNotMigrated = errors.New("pglease: lease tables not found (run fencekit migrate up)")
	// ErrPooler is matched by session mode's Acquire error when the
	// connection does not reach the server directly: the server process
	// that ran the statement (pg_backend_pid()) is not the one the
	// connection announced when it was opened (BackendKeyData), which is
	// what a connection pooler such as PgBouncer does. Behind a pooler in
	// transaction mode, an advisory lock stays on a server connection that
	// other clients then use. Nothing is held when it is returned. Set
	// Options.AllowPooler only for a pooler that pins one server
	// connection per client connection (PgBouncer pool_mode=session).
	ErrPooler = errors.New("pglease: session mode needs a direct connection to PostgreSQL, and this one goes through a pooler")
)

// Options configures a Backend. New starts from the zero value, whose
// fields document their defaults, and applies each Option in turn.
type Options struct {
	// Mode is ModeTable (the default) or ModeSession.
	Mode Mode
	// Schema is the schema holding LeaseTable and SessionLeaseTable,
	// created there by package migrations. Default "": unqualified names,
	// found through the connections' search_path, which is where
	// migrations.Up puts them by default.
	Schema string
	// AllowPooler lets session mode run over connections whose server
	// process differs from the one announced at connect (see ErrPooler).
	// Set it only behind a pooler in session mode (PgBouncer
	// pool_mode=session). Every renew still checks that the same server
	// process holds the lock, so a transaction-mode pooler is detected at
	// the first renew at the latest. Default false. Ignored in table mode.
	AllowPooler bool
	// Logger receives warnings about the listening connection (lost,
	// reconnected). Default slog.Default().
	Logger *slog.Logger
}

// Option sets fields of Options; any func(*Options) is one.
type Option func(*Options)

// WithMode sets Options.Mode.
func WithMode(m Mode) Option { return func(o *Options) { o.Mode = m } }

// WithSchema sets Options.Schema.
func WithSchema(schema string) Option { return func(o *Options) { o.Schema = schema } }

// WithLogger sets Options.Logger.
func WithLogger(l *slog.Logger) Option { return func(o *Options) { o.Logger = l } }

// Backend stores leases in PostgreSQL, in the Mode chosen at New. It is safe
// for concurrent use. Call Close when done, before closing the pool: it ends
// the listening connection and, in session mode, the sessions of leases
// still held.
type Backend struct {
	db  Pool
	o   Options
	q   pgleasesql.Statements
	hub *hub

	mu     sync.Mutex
	pins   map[*pin]struct{} // session mode: live pinned connections
	byName map[string]*pin   // session mode: the newest live pin of each name
	closed bool
}

// New returns a Backend over db configured by opts. It does no I/O. It
// returns an error matching ErrInvalidOptions, listing every problem, when
// db is nil, the mode is unknown or the schema is not a valid identifier.
func New(db Pool, opts ...Option) (*Backend, error) {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var errs []error
	if db == nil {
		errs = append(errs, fmt.Errorf("%w: pool is nil", ErrInvalidOptions))
	}
	if o.Mode != ModeTable && o.Mode != ModeSession {
		errs = append(errs, fmt.Errorf("%w: unknown mode %d", ErrInvalidOptions, int(o.Mode)))
	}
	if o.Schema != "" {
		errs = append(errs, pgident.Check(ErrInvalidOptions, "schema", o.Schema))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	b := &Backend{db: db, o: o, q: pgleasesql.New(o.Schema), pins: make(map[*pin]struct{}), byName: make(map[string]*pin)}
	b.hub = newHub(db, o.Logger)
	return b, nil
}

// Options returns the backend's options, with defaults filled in.
func (b *Backend) Options() Options { return b.o }

// lockKey is session mode's advisory lock key for a name: 64 bits of
// FNV-1a over a fixed prefix, the schema and the name. Advisory locks are
// per database, so the schema keeps backends of different schemas apart
// (Schema "" shares one key space across search paths).
func lockKey(schema, name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("fencekit/pglease\x00"))
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// Limits implements driver.Backend. Table mode: TTLs are whole microseconds
// (timestamptz), at least MinTTL. Session mode: whole milliseconds
// (idle_session_timeout), at least MinTTL and at most 2^31-1 ms.
func (b *Backend) Limits() driver.Limits {
	if b.o.Mode == ModeSession {
		return driver.Limits{MinTTL: MinTTL, MaxTTL: maxSessionTTL, Resolution: time.Millisecond, Queues: true}
	}
	return driver.Limits{MinTTL: MinTTL, Resolution: time.Microsecond, Queues: true}
}

// Acquire implements driver.Backend in one statement (one round trip once
// pgx has prepared it on the connection). A refusal carries the time left
// until the name's stored expiry as NotAcquiredError.RetryAfter (0 when it
// has passed: in session mode, a session may hold the lock past it).
// Errors:
// ErrClosed after Close; ErrNotMigrated; ErrPooler (session mode); the
// pool's or the server's error otherwise.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.isClosed() {
		return driver.Grant{}, ErrClosed
	}
	if b.o.Mode == ModeSession {
		return b.sessionAcquire(ctx, req)
	}
	return b.tableAcquire(ctx, req)
}

// Renew implements driver.Backend in one statement: table mode extends the
// row's expiry only if it still holds g's owner and token and has not
// expired; session mode checks on the pinned connection that the same
// server process still holds the advisory lock (pg_locks) and that the
// token row still names g's owner and token.
func (b *Backend) Renew(ctx context.Context, g driver.Grant) error {
	if b.o.Mode == ModeSession {
		return b.sessionRenew(ctx, g)
	}
	return b.tableRenew(ctx, g)
}

// RenewBatch implements driver.BatchRenewer. Table mode sends one statement
// for all grants (arrays unnested in one UPDATE: one round trip) and
// reports every outcome when it answers. Session mode renews each grant on
// its own pinned connection, all at once, and reports each as its
// connection answers, so one stalled connection holds up no other grant.
func (b *Backend) RenewBatch(ctx context.Context, gs []driver.Grant, done func(i int, err error)) {
	if b.o.Mode == ModeSession {
		var wg sync.WaitGroup
		for i, g := range gs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				done(i, b.sessionRenew(ctx, g))
			}()
		}
		wg.Wait()
		return
	}
	b.tableRenewBatch(ctx, gs, done)
}

// Release implements driver.Backend in one statement that also announces the
// release on Channel (NOTIFY, delivered when the statement commits), so
// that waiters wake at once. Table mode frees the row only if it still
// holds g's owner and token and has not expired; session mode also marks
// the token row free, unlocks the advisory lock and gives the pinned
// connection back to the pool, or closes it when the lock's state is in
// doubt. Either way the owner is recorded as ended
// (driver.EndedOwnerTTL(g.TTL)), and a Release of an owner already ended by
// an earlier Release or an Abandon returns nil: a retried release is a
// release, not a loss. The statement commits without waiting for the WAL
// flush: a release lost in a server crash leaves the grant to expire (see
// the package documentation).
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if b.o.Mode == ModeSession {
		return b.sessionRelease(ctx, g)
	}
	return b.tableRelease(ctx, g)
}

// Abandon implements driver.Backend in one statement on any connection of
// the pool: it ends req.Owner's grant of req.Name if it holds one,
// records the owner as ended for driver.EndedOwnerTTL(req.TTL), so that
// Acquire refuses it, and announces a release on Channel (a waiter woken
// when nothing was ended tries again). In session mode it also ends the
// session that holds the owner's advisory lock: a pin of this Backend is
// closed directly; another process's session is terminated on the server
// (pg_terminate_backend, only a session of the same user; otherwise it
// ends at that holder's next renewal, which finds the row no longer names
// it). It returns nil whether or not the owner held anything.
func (b *Backend) Abandon(ctx context.Context, req driver.Request) error {
	if b.o.Mode == ModeSession {
		return b.sessionAbandon(ctx, req)
	}
	return b.tableAbandon(ctx, req)
}

// Watch implements driver.Watcher over one listening connection per Backend,
// taken from the pool (and kept out of it) on first use. It returns once
// LISTEN is active, bounded by ctx. While that connection is down, Watch
// fails and waiters poll; when it comes back every waiter is signalled, in
// case a release was missed meanwhile. Through a pooler in transaction mode
// LISTEN cannot work, and waiters wake only by polling.
func (b *Backend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	if b.isClosed() {
		return nil, nil, ErrClosed
	}
	return b.hub.watch(ctx, name)
}

// Holder implements driver.Inspector in one statement. Table mode: the row's
// owner and token while its expiry has not passed, and the time left.
// Session mode: the last grant's owner and token while its row's expiry
// has not passed or the session it was granted to still holds the advisory
// lock, and the time left until that expiry (0 once it has passed).
func (b *Backend) Holder(ctx context.Context, name string) (driver.Holder, error) {
	var (
		owner string
		token int64
		left  int64
		err   error
	)
	if b.o.Mode == ModeSession {
		key := lockKey(b.o.Schema, name)
		err = b.db.QueryRow(ctx, b.q.SessionHolder, name, int64(uint64(key)>>32), int64(uint64(key)&0xffffffff)).Scan(&owner, &token, &left)
	} else {
		err = b.db.QueryRow(ctx, b.q.Holder, name).Scan(&owner, &token, &left)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return driver.Holder{}, driver.ErrNotHeld
	case err != nil:
		return driver.Holder{}, b.storeErr("holder of", name, err)
	}
	return driver.Holder{Name: name, Owner: owner, Token: fence.Token(token), Remaining: time.Duration(left) * time.Microsecond}, nil
}

// Close ends the listening connection and its goroutine and, in session
// mode, the sessions of leases still held: their leases are reported lost,
// then their connections are closed (the server frees their locks) and
// their token rows marked free (bounded by one second each). It
// does not close the pool. Acquire and Watch fail with ErrClosed
// afterwards; table-mode leases already acquired keep working.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	pins := make([]*pin, 0, len(b.pins))
	for p := range b.pins {
		pins = append(pins, p)
	}
	b.mu.Unlock()
	for _, p := range pins {
		p.abandon(ErrClosed)
	}
	b.hub.close()
	return nil
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// SQLSTATE codes the backend interprets.
const (
	codeUndefinedTable    = "42P01"
	codeInvalidSchemaName = "3F000"
	// Besides the server's own functions, the statements call only the
	// ones the migrations create (fencekit_lease_owner_ended,
	// fencekit_session_lease_owner_ended): one that is missing was not
	// created.
	codeUndefinedFunction = "42883"
)

// setupFixes names, for each SQLSTATE that retrying cannot fix, what is
// wrong and what to do. ErrNotMigrated's codes are handled apart.
var setupFixes = map[string]string{
	"3D000": "the database does not exist: check the database name in the connection string (FENCE_POSTGRES_URL for the tests and demos)",
	"28P01": "the server refused the password: check the user and password in the connection string",
	"28000": "the server refused the connection for this user (pg_hba.conf or a missing role): check the user in the connection string",
	"42501": "the user may not use the lease tables: grant it SELECT, INSERT, UPDATE and DELETE on them, or connect as their owner",
	"25006": "the server takes only reads (a standby): connect to the primary",
}

// storeErr wraps an error of operation op on name: one that retrying
// cannot fix (a missing table or schema, refused credentials or
// privileges, a missing database, a read-only server) as a
// *driver.SetupError naming the fix; any other as the store's error.
func (b *Backend) storeErr(op, name string, err error) error {
	return b.storeErrOn(fmt.Sprintf("%s %q", op, name), err)
}

// storeErrOn is storeErr for an operation described by what ("acquire
// \"x\"", "check the lease table ..."). Each error says "pglease:" once
// and its fix once.
func (b *Backend) storeErrOn(what string, err error) error {
	wrapped := fmt.Errorf("pglease: %s: %w", what, err)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return wrapped
	}
	switch pgErr.Code {
	case codeUndefinedTable, codeInvalidSchemaName, codeUndefinedFunction:
		return &driver.SetupError{Err: notMigrated{wrapped}, Fix: b.migrateFix()}
	}
	if fix, ok := setupFixes[pgErr.Code]; ok {
		return &driver.SetupError{Err: wrapped, Fix: fix}
	}
	return wrapped
}

// migrateFix is the fix for lease tables not found: the command that
// creates them where this Backend looks (with --schema when Options.Schema
// is set, as the guards' errors say it), which needs the schema to exist
// (the server's error does not always say whether it does: a qualified
// table in a missing schema is only a missing table, 42P01).
func (b *Backend) migrateFix() string {
	if b.o.Schema == "" {
		return "the lease tables are not in the connection's search_path: run `fencekit migrate up` there (or migrations.Up), or set Options.Schema to the schema that has them"
	}
	return fmt.Sprintf("the lease tables are not in schema %q (Options.Schema): run `fencekit migrate up --schema %s` (or migrations.Up) there, after CREATE SCHEMA %s if it does not exist, or fix Options.Schema",
		b.o.Schema, pgident.ShellWord(b.o.Schema), pgident.Quote(b.o.Schema))
}

// notMigrated is a store error that also matches ErrNotMigrated, without
// repeating its text (the SetupError around it names the fix).
type notMigrated struct{ error }

func (e notMigrated) Is(target error) bool { return target == ErrNotMigrated }
func (e notMigrated) Unwrap() error        { return e.error }

// Check implements driver.Checker in one round trip that reads and changes
// nothing: it fails with an error matching driver.ErrSetup (and
// ErrNotMigrated) when the mode's lease table or its table of ended owners
// (EndedTable, SessionEndedTable) is missing, with one matching
// driver.ErrSetup when the user may not read and write both or the server
// refuses the connection for good (see storeErr), and with the store's
// error when the server cannot be reached. ctx bounds it.
func (b *Backend) Check(ctx context.Context) error {
	table, ended := b.q.Leases, b.q.Ended
	if b.o.Mode == ModeSession {
		table, ended = b.q.Sessions, b.q.SessionEnded
	}
	what := "check the lease tables " + table + " and " + ended
	var ok bool
	if err := b.db.QueryRow(ctx, b.q.Check, table, ended).Scan(&ok); err != nil {
		return b.storeErrOn(what, err)
	}
	if !ok {
		return &driver.SetupError{Fix: "pglease: " + what + ": " + setupFixes["42501"]}
	}
	return nil
}

// micros returns ttl in whole microseconds, or an error if it is not a
// positive whole number of them.
func micros(ttl time.Duration) (int64, error) {
	if ttl < time.Microsecond || ttl%time.Microsecond != 0 {
		return 0, fmt.Errorf("pglease: TTL %v is not a positive whole number of microseconds", ttl)
	}
	return ttl.Microseconds(), nil
}
