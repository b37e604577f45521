package zklease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/lease/driver"
)

// Operating leases: driver.Lister and driver.Revoker.

var (
	_ driver.Lister  = (*Backend)(nil)
	_ driver.Revoker = (*Backend)(nil)
)

// unescapeName reverses escapeName; ok is false for a node name that
// escapeName cannot have made.
func unescapeName(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		case c == '%' && i+2 < len(s):
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil || s[i+1:i+3] != strings.ToUpper(s[i+1:i+3]) {
				return "", false
			}
			b.WriteByte(byte(v))
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

// List implements driver.Lister: one listing of Options.Root (after a
// sync), then Status per name whose parent is under prefix. Nodes under
// the root that are not lease parents of this backend are skipped.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Status, error) {
	var names []string
	err := b.async(ctx, "list", prefix, func() error {
		if _, err := b.conn.Sync(b.o.Root); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("zklease: list %q: sync: %w", prefix, err)
		}
		kids, _, err := b.conn.Children(b.o.Root)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("zklease: list %q: %w", prefix, err)
		}
		for _, k := range kids {
			if n, ok := unescapeName(k); ok && strings.HasPrefix(n, prefix) && driver.ValidateName(n) == nil {
				names = append(names, n)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []driver.Status
	for _, n := range names {
		st, err := b.Status(ctx, n)
		if err != nil {
			return nil, err
		}
		if st.Held() || st.Waiters > 0 {
			out = append(out, st)
		}
	}
	return out, nil
}

// Status implements driver.Lister: Holder (a sync, a listing of the
// name's queue and a read of its lowest node) and one more listing for
// the waiters: every node behind the lowest, tickets of waiting backends
// and places in line alike. A place whose waiter died is counted until
// its session ends (ZooKeeper keeps no time a read could compare with).
func (b *Backend) Status(ctx context.Context, name string) (driver.Status, error) {
	if err := driver.ValidateName(name); err != nil {
		return driver.Status{}, err
	}
	st := driver.Status{Name: name}
	h, err := b.Holder(ctx, name)
	switch {
	case errors.Is(err, driver.ErrNotHeld):
		return st, nil
	case err != nil:
		return driver.Status{}, err
	}
	st.Holder = h
	parent := ParentPath(b.o.Root, name)
	err = b.async(ctx, "status", name, func() error {
		kids, _, err := b.conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("zklease: status %q: list: %w", name, err)
		}
		st.Waiters = max(len(kids)-1, 0)
		return nil
	})
	if err != nil {
		return driver.Status{}, err
	}
	return st, nil
}

// Revoke implements driver.Revoker: after a sync it lists the name's queue
// and reads its lowest node; if that node names h.Owner and its czxid is
// h.Token, one transaction (Multi) deletes it (at the version read) and
// records the owner as ended (EndedPath, an ephemeral node of this
// backend's session, kept for driver.RevokedOwnerTTL(h) or until this
// Backend closes). The next node in the queue is then the lowest: its
// backend, watching the deleted node, is woken and granted the name with
// a greater czxid. The holder's backend finds its node gone at its next
// renewal. A late create by the revoked owner could only come from the
// holder's own session, which has none pending once its grant was made;
// so the record's life with this session is enough.
func (b *Backend) Revoke(ctx context.Context, h driver.Holder) error {
	if err := driver.CheckRevoke(h); err != nil {
		return err
	}
	parent := ParentPath(b.o.Root, h.Name)
	tomb := b.endedPath(h.Name, h.Owner)
	notHeld := fmt.Errorf("%w: %q is not held by %q with token %d", driver.ErrNotHeld, h.Name, h.Owner, h.Token)
	return b.async(ctx, "revoke", h.Name, func() error {
		resent := false
		for attempt := 0; ; attempt++ {
			if attempt == 10 {
				return fmt.Errorf("zklease: revoke %q: the holder's node kept changing", h.Name)
			}
			if _, err := b.conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return fmt.Errorf("zklease: revoke %q: sync: %w", h.Name, err)
			}
			names, _, err := b.conn.Children(parent)
			if errors.Is(err, zk.ErrNoNode) || (err == nil && len(names) == 0) {
				return b.revokeGone(resent, notHeld, h)
			}
			if err != nil {
				return fmt.Errorf("zklease: revoke %q: list: %w", h.Name, err)
			}
			kids, err := parseChildren(parent, names)
			if err != nil {
				return err
			}
			path := parent + "/" + kids[0].name
			data, stat, err := b.conn.Get(path)
			if errors.Is(err, zk.ErrNoNode) {
				continue // released between the listing and the read
			}
			if err != nil {
				return fmt.Errorf("zklease: revoke %q: read: %w", h.Name, err)
			}
			if nodeOwner(data) != h.Owner || fenceToken(stat.Czxid) != h.Token {
				return b.revokeGone(resent, notHeld, h)
			}
			res, err := b.conn.Multi(
				&zk.DeleteRequest{Path: path, Version: stat.Version},
				&zk.CreateRequest{Path: tomb, Acl: b.o.ACL, Flags: zk.FlagEphemeral},
			)
			if err == nil {
				b.noteEnded(h.Name, h.Owner, h.Remaining, true)
				return nil
			}
			if ambiguous(err) && !b.isClosedNow() {
				resent = true
				time.Sleep(20 * time.Millisecond)
				continue
			}
			switch i, opErr := failedOp(res, err); {
			case i == 1 && errors.Is(opErr, zk.ErrNoNode):
				if err := b.ensureEndedDir(); err != nil {
					return err
				}
			case i == 1 && errors.Is(opErr, zk.ErrNodeExists):
				// This backend recorded the owner ended already: delete
				// the node alone, at the version read.
				if err := b.conn.Delete(path, stat.Version); err == nil {
					b.noteEnded(h.Name, h.Owner, h.Remaining, false)
					return nil
				} else if !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) {
					return fmt.Errorf("zklease: revoke %q: delete %s: %w", h.Name, path, err)
				}
			case i == 0 && (errors.Is(opErr, zk.ErrBadVersion) || errors.Is(opErr, zk.ErrNoNode)):
				// Changed or gone since the read (a ticket claimed for
				// another owner, a place refreshed): read again.
			default:
				return fmt.Errorf("zklease: revoke %q: %w", h.Name, err)
			}
		}
	})
}

// revokeGone is Revoke's answer when the named grant is not the lowest
// node: ErrNotHeld, unless an earlier attempt's answer was lost and the
// owner's record exists (that attempt may have revoked it).
func (b *Backend) revokeGone(resent bool, notHeld error, h driver.Holder) error {
	if !resent {
		return notHeld
	}
	if ok, _, err := b.conn.Exists(b.endedPath(h.Name, h.Owner)); err == nil && ok {
		b.noteEnded(h.Name, h.Owner, h.Remaining, true)
		return nil // the lost attempt was applied: its record is there
	}
	return notHeld
}
