package zklease

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/go-zookeeper/zk"
)

// Options configures a Backend. New starts from the zero value, applies each
// Option, fills every zero field with its documented default and validates
// the result. It never changes values the caller holds.
type Options struct {
	// SessionTimeout is the ZooKeeper session timeout the backend asks
	// for, and the longest lease TTL it accepts (Limits.MaxTTL): a grant
	// is kept by its session, which the ensemble ends SessionTimeout after
	// the last request it heard from this client, so a TTL longer than the
	// session timeout could not be honoured. It must be a whole number of
	// milliseconds, at least MinTTL. Default 10 s.
	//
	// The ensemble bounds the timeout it grants to its minSessionTimeout
	// and maxSessionTimeout (by default 2 and 20 × tickTime). The backend
	// reads the timeout each server actually granted off the wire, and
	// refuses to grant or renew a lease whose TTL is longer (an error, not
	// a grant).
	SessionTimeout time.Duration

	// Root is the znode under which each lease name gets a parent node.
	// It must be an absolute ZooKeeper path without a trailing slash
	// ("/" is not allowed). Default "/fencekit/leases".
	Root string

	// Identity is written, followed by "/waiting", into the nodes the
	// backend queues for its waiters (grants hold their owner), so that an
	// operator can see which process waits for a lease (the node's
	// ephemeralOwner is its session). At most 256 bytes, printable.
	// Default "host/pid-N".
	Identity string

	// ACL is the access list of the nodes the backend creates. Default
	// zk.WorldACL(zk.PermAll).
	ACL []zk.ACL

	// Dialer opens the TCP connections to the servers (a proxy, a test's
	// fault injector). The backend wraps every connection it returns to
	// read the session the server granted. Default net.DialTimeout.
	Dialer zk.Dialer

	// Logger receives go-zookeeper's log lines (at debug level) and the
	// backend's warnings. Default: slog.Default(), as for every fencekit
	// package.
	Logger *slog.Logger
}

// Option sets fields of Options; any func(*Options) is one, so a caller can
// set several fields at once.
type Option func(*Options)

// WithSessionTimeout sets Options.SessionTimeout.
func WithSessionTimeout(d time.Duration) Option { return func(o *Options) { o.SessionTimeout = d } }

// WithRoot sets Options.Root.
func WithRoot(root string) Option { return func(o *Options) { o.Root = root } }

// WithIdentity sets Options.Identity.
func WithIdentity(id string) Option { return func(o *Options) { o.Identity = id } }

// WithDialer sets Options.Dialer.
func WithDialer(d zk.Dialer) Option { return func(o *Options) { o.Dialer = d } }

// WithLogger sets Options.Logger.
func WithLogger(l *slog.Logger) Option { return func(o *Options) { o.Logger = l } }

// DefaultRoot is the default of Options.Root.
const DefaultRoot = "/fencekit/leases"

// DefaultSessionTimeout is the default of Options.SessionTimeout.
const DefaultSessionTimeout = 10 * time.Second

// MinTTL is the shortest lease TTL the backend accepts: shorter ones leave
// no room for a renewal that goes through a quorum.
const MinTTL = 50 * time.Millisecond

func (o Options) withDefaults() Options {
	if o.SessionTimeout == 0 {
		o.SessionTimeout = DefaultSessionTimeout
	}
	if o.Root == "" {
		o.Root = DefaultRoot
	}
	if o.Identity == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "host"
		}
		o.Identity = fmt.Sprintf("%s/pid-%d", host, os.Getpid())
	}
	if o.ACL == nil {
		o.ACL = zk.WorldACL(zk.PermAll)
	} else {
		o.ACL = append([]zk.ACL(nil), o.ACL...)
	}
	if o.Dialer == nil {
		o.Dialer = net.DialTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// validate reports every problem at once, each matching ErrInvalidOptions.
func (o Options) validate(servers []string) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if len(servers) == 0 {
		bad("no servers")
	}
	for _, s := range servers {
		if host, port, err := net.SplitHostPort(s); err != nil || host == "" || port == "" {
			bad("server %q is not host:port", s)
		}
	}
	switch {
	case o.SessionTimeout < MinTTL:
		bad("session timeout %v is shorter than the minimum TTL %v", o.SessionTimeout, MinTTL)
	case o.SessionTimeout%time.Millisecond != 0:
		bad("session timeout %v is not a whole number of milliseconds", o.SessionTimeout)
	case o.SessionTimeout > time.Duration(1<<31-1)*time.Millisecond:
		bad("session timeout %v does not fit ZooKeeper's 32-bit milliseconds", o.SessionTimeout)
	}
	if err := checkRoot(o.Root); err != nil {
		bad("root: %v", err)
	}
	if len(o.Identity) > 256 {
		bad("identity is %d bytes, the limit is 256", len(o.Identity))
	}
	for _, r := range o.Identity {
		if !unicode.IsPrint(r) {
			bad("identity %q contains the unprintable %U", o.Identity, r)
			break
		}
	}
	return errors.Join(errs...)
}

// checkRoot accepts an absolute path of non-empty components other than "."
// and "..", without characters ZooKeeper refuses.
func checkRoot(root string) error {
	if !strings.HasPrefix(root, "/") || root == "/" || strings.HasSuffix(root, "/") {
		return fmt.Errorf("%q must start with '/', not end with one, and not be \"/\"", root)
	}
	for _, c := range strings.Split(root[1:], "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("%q has an empty, \".\" or \"..\" component", root)
		}
		for _, r := range c {
			if !allowedInPath(r) {
				return fmt.Errorf("%q contains %U, which ZooKeeper does not allow in a path", root, r)
			}
		}
	}
	return nil
}

// allowedInPath reports whether ZooKeeper accepts r in a node name (the
// ranges its PathUtils.validatePath refuses).
func allowedInPath(r rune) bool {
	switch {
	case r == 0, r > 0 && r <= 0x1f, r >= 0x7f && r <= 0x9f,
		r >= 0xd800 && r <= 0xf8ff, r >= 0xfff0 && r <= 0xffff:
		return false
	}
	return true
}
