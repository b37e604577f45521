package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

func (b *Backend) tableAcquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	us, err := micros(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	if req.Queue {
		return b.tableAcquireQueued(ctx, req, us)
	}
	var (
		granted     bool
		token, hint int64
	)
	err = b.db.QueryRow(ctx, b.q.Acquire, req.Name, req.Owner, us).Scan(&granted, &token, &hint)
	switch {
	case err != nil:
		return driver.Grant{}, b.storeErr("acquire", req.Name, err)
	case !granted:
		return driver.Grant{}, refusal(req, hint)
	case token <= 0:
		return driver.Grant{}, fmt.Errorf("pglease: acquire %q: the store returned an invalid token %d", req.Name, token)
	}
	return driver.Grant{Name: req.Name, Owner: req.Owner, Token: fence.Token(token), TTL: req.TTL}, nil
}

// tableAcquireQueued is tableAcquire for an owner that waits in line, in
// one statement (AcquireQueued).
func (b *Backend) tableAcquireQueued(ctx context.Context, req driver.Request, us int64) (driver.Grant, error) {
	var (
		granted, ended                bool
		token, leftUs, ahead, firstUs int64
	)
	err := b.db.QueryRow(ctx, b.q.AcquireQueued, req.Name, req.Owner, us).Scan(&granted, &token, &leftUs, &ahead, &firstUs, &ended, nil)
	switch {
	case err != nil:
		return driver.Grant{}, b.storeErr("acquire", req.Name, err)
	case !granted:
		return driver.Grant{}, queuedRefusal(req, ended, leftUs, ahead, firstUs)
	case token <= 0:
		return driver.Grant{}, fmt.Errorf("pglease: acquire %q: the store returned an invalid token %d", req.Name, token)
	}
	return driver.Grant{Name: req.Name, Owner: req.Owner, Token: fence.Token(token), TTL: req.TTL}, nil
}

// refusal is the refusal of an acquire whose statement gave hint (the
// refusal function's): -1 for an ended owner, else the time the name's
// row has left, in µs.
func refusal(req driver.Request, hint int64) error {
	if hint < 0 {
		return endedOwnerErr(req)
	}
	return &driver.NotAcquiredError{Name: req.Name, RetryAfter: time.Duration(hint) * time.Microsecond}
}

// queuedRefusal is the refusal of a queued acquire: of an ended owner
// (not put in line); while another owner holds the name (with its time
// left, leftUs); while the name is free but kept for ahead waiters (with
// the time left of the first one's place, firstUs); or, when the
// statement's snapshot saw none of these (a grant made meanwhile),
// without a hint.
func queuedRefusal(req driver.Request, ended bool, leftUs, ahead, firstUs int64) error {
	switch {
	case ended:
		return endedOwnerErr(req)
	case leftUs > 0:
		return &driver.NotAcquiredError{Name: req.Name, RetryAfter: time.Duration(leftUs) * time.Microsecond}
	case ahead > 0:
		return &driver.NotAcquiredError{Name: req.Name, Ahead: int(ahead), RetryAfter: time.Duration(firstUs) * time.Microsecond}
	}
	return &driver.NotAcquiredError{Name: req.Name}
}

func (b *Backend) tableRenew(ctx context.Context, g driver.Grant) error {
	us, err := micros(g.TTL)
	if err != nil {
		return err
	}
	tag, err := b.db.Exec(ctx, b.q.Renew, g.Name, g.Owner, int64(g.Token), us)
	if err != nil {
		return b.storeErr("renew", g.Name, err)
	}
	if tag.RowsAffected() != 1 {
		return driver.ErrNotHeld
	}
	return nil
}

type grantKey struct {
	name, owner string
	token       int64
}

// tableRenewBatch renews every grant in one statement, and reports each
// outcome when that statement has answered (the grants are all on one
// server, so they are known together).
func (b *Backend) tableRenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
	bad := make([]error, len(gs))
	names := make([]string, 0, len(gs))
	owners := make([]string, 0, len(gs))
	tokens := make([]int64, 0, len(gs))
	ttls := make([]int64, 0, len(gs))
	for i, g := range gs {
		us, err := micros(g.TTL)
		if err != nil {
			bad[i] = err
			continue
		}
		names, owners, tokens, ttls = append(names, g.Name), append(owners, g.Owner), append(tokens, int64(g.Token)), append(ttls, us)
	}
	renewed := make(map[grantKey]bool, len(names))
	var err error
	if len(names) > 0 {
		var rows pgx.Rows
		rows, err = b.db.Query(ctx, b.q.RenewBatch, names, owners, tokens, ttls)
		if err == nil {
			for rows.Next() {
				var k grantKey
				if err = rows.Scan(&k.name, &k.owner, &k.token); err != nil {
					break
				}
				renewed[k] = true
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	}
	for i, g := range gs {
		switch {
		case bad[i] != nil:
			done(i, bad[i])
		case err != nil:
			done(i, b.storeErr("renew", g.Name, err))
		case !renewed[grantKey{g.Name, g.Owner, int64(g.Token)}]:
			done(i, driver.ErrNotHeld)
		default:
			done(i, nil)
		}
	}
}

func (b *Backend) tableRelease(ctx context.Context, g driver.Grant) error {
	var released, already bool
	err := b.db.QueryRow(ctx, b.q.Release, g.Name, g.Owner, int64(g.Token), Channel, endedMicros(g.TTL)).Scan(&released, &already, nil)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return driver.ErrNotHeld // the name has no row (data loss)
	case err != nil:
		return b.storeErr("release", g.Name, err)
	case released || already:
		// released: the row is free with this grant's token, freed now or
		// by an earlier request; already: the owner was ended before (a
		// retried request whose first reply was lost, after the name
		// moved on). Either way a release, not a loss.
		return nil
	}
	return driver.ErrNotHeld
}

func (b *Backend) tableAbandon(ctx context.Context, req driver.Request) error {
	var n int64
	if err := b.db.QueryRow(ctx, b.q.Abandon, req.Name, req.Owner, endedMicros(req.TTL), Channel, req.Queue).Scan(&n); err != nil {
		return b.storeErr("abandon", req.Name, err)
	}
	return nil
}

// endedMicros is how long, in µs, the store remembers an owner it ended
// for a grant of ttl: driver.EndedOwnerTTL.
func endedMicros(ttl time.Duration) int64 { return driver.EndedOwnerTTL(ttl).Microseconds() }

// endedOwnerErr is Acquire's refusal of an owner the store ended.
func endedOwnerErr(req driver.Request) error {
	return fmt.Errorf("%w: %q: owner %q was released or abandoned at the store (an acquire request that arrived after its sender stopped waiting for it)",
		driver.ErrNotAcquired, req.Name, req.Owner)
}
