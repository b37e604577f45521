package pglease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgleasesql"
	"github.com/fencekit/fencekit/lease/driver"
)

// Operating leases: driver.Lister and driver.Revoker, in both modes.

var (
	_ driver.Lister  = (*Backend)(nil)
	_ driver.Revoker = (*Backend)(nil)
)

// ops returns the operator's statements for the backend's schema. They
// are built per call: an operator's tool sends a few.
func (b *Backend) ops() pgleasesql.Operations { return pgleasesql.NewOperations(b.o.Schema) }

// List implements driver.Lister. Table mode: one statement reads the live
// grants and live waiters of the names under prefix. Session mode: one
// statement finds the names whose row names an owner or that have live
// waiters, then Status reads each (a grant is held while its row's expiry
// has not passed or its session still holds the advisory lock, which
// needs the name's lock key). Errors: as Holder's.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Status, error) {
	var out []driver.Status
	if b.o.Mode == ModeSession {
		rows, err := b.db.Query(ctx, b.ops().SessionNames, prefix)
		if err != nil {
			return nil, b.storeErr("list", prefix, err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, b.storeErr("list", prefix, err)
		}
		for _, n := range names {
			st, err := b.sessionStatus(ctx, n)
			if err != nil {
				return nil, err
			}
			if st.Held() || st.Waiters > 0 {
				out = append(out, st)
			}
		}
	} else {
		rows, err := b.db.Query(ctx, b.ops().List, prefix)
		if err != nil {
			return nil, b.storeErr("list", prefix, err)
		}
		if out, err = collectStatus(rows); err != nil {
			return nil, b.storeErr("list", prefix, err)
		}
	}
	slices.SortFunc(out, func(a, b driver.Status) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// collectStatus reads the rows of the table mode's List and Status.
func collectStatus(rows pgx.Rows) ([]driver.Status, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (driver.Status, error) {
		var (
			st                 driver.Status
			owner              string
			token, left, count int64
		)
		if err := r.Scan(&st.Name, &owner, &token, &left, &count); err != nil {
			return st, err
		}
		st.Waiters = int(count)
		if owner != "" {
			st.Holder = driver.Holder{Name: st.Name, Owner: owner, Token: fence.Token(token), Remaining: time.Duration(left) * time.Microsecond}
		}
		return st, nil
	})
}

// Status implements driver.Lister: in table mode one statement; in session
// mode Holder's statement and a count of the live waiters.
func (b *Backend) Status(ctx context.Context, name string) (driver.Status, error) {
	if err := driver.ValidateName(name); err != nil {
		return driver.Status{}, err
	}
	if b.o.Mode == ModeSession {
		return b.sessionStatus(ctx, name)
	}
	rows, err := b.db.Query(ctx, b.ops().Status, name)
	if err != nil {
		return driver.Status{}, b.storeErr("status of", name, err)
	}
	sts, err := collectStatus(rows)
	if err != nil {
		return driver.Status{}, b.storeErr("status of", name, err)
	}
	if len(sts) == 0 {
		return driver.Status{Name: name}, nil
	}
	return sts[0], nil
}

func (b *Backend) sessionStatus(ctx context.Context, name string) (driver.Status, error) {
	st := driver.Status{Name: name}
	h, err := b.Holder(ctx, name)
	switch {
	case err == nil:
		st.Holder = h
	case !errors.Is(err, driver.ErrNotHeld):
		return driver.Status{}, err
	}
	var n int64
	if err := b.db.QueryRow(ctx, b.ops().SessionWaiters, name).Scan(&n); err != nil {
		return driver.Status{}, b.storeErr("status of", name, err)
	}
	st.Waiters = int(n)
	return st, nil
}

// Revoke implements driver.Revoker in one statement on any connection of
// the pool. Table mode: the row is marked free if it still holds h's
// owner and token and has not expired, as Release does, and the owner is
// recorded as ended for driver.RevokedOwnerTTL(h). Session mode: the same
// on the token row (held while its expiry has not passed or its session
// holds the lock), and the session that holds the advisory lock is ended
// (pg_terminate_backend, waiting up to 5 s, only a session of the same
// user; otherwise the lock stays until that holder's next renewal, which
// finds the row no longer names it, and the next holder waits until
// then). Both announce a release on Channel. The store records only that
// the owner ended, not how: the revoked holder's Release returns nil if it
// comes before its next renewal.
func (b *Backend) Revoke(ctx context.Context, h driver.Holder) error {
	if err := driver.CheckRevoke(h); err != nil {
		return err
	}
	ended := driver.RevokedOwnerTTL(h).Microseconds()
	var revoked bool
	var err error
	if b.o.Mode == ModeSession {
		key := lockKey(b.o.Schema, h.Name)
		var terminated bool
		err = b.db.QueryRow(ctx, b.ops().SessionRevoke, h.Name, h.Owner, int64(h.Token), ended, Channel,
			int64(uint64(key)>>32), int64(uint64(key)&0xffffffff)).Scan(&revoked, &terminated)
	} else {
		var notified bool
		err = b.db.QueryRow(ctx, b.ops().Revoke, h.Name, h.Owner, int64(h.Token), ended, Channel).Scan(&notified)
		revoked = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	switch {
	case err != nil:
		return b.storeErr("revoke", h.Name, err)
	case !revoked:
		return fmt.Errorf("%w: %q is not held by %q with token %d", driver.ErrNotHeld, h.Name, h.Owner, h.Token)
	}
	return nil
}
