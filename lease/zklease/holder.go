package zklease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/lease/driver"
)

var _ driver.Inspector = (*Backend)(nil)

// waitingSuffix ends the data of a ticket no owner has claimed yet: its
// backend's Identity + "/waiting". A Manager's owners end with "/" and 32
// hex digits, so no owner reads like it.
const waitingSuffix = "/waiting"

func (b *Backend) waitingData() string { return b.o.Identity + waitingSuffix }

// maxHolderWait bounds how long Holder waits for a ticket that became the
// lowest node to be written with its new owner.
const maxHolderWait = 2 * time.Second

// Holder implements driver.Inspector: after a sync (so that a grant or
// release that returned before the call is seen, whichever member
// answers), it lists the queue and reads the lowest node: its data is the
// owner, its czxid the token. Remaining is 0: the grant's TTL is kept by
// the holder's backend, and its session's expiry by the ensemble, neither
// readable here.
//
// A lease handed over to a waiting backend is granted before its node is
// written with the new owner (one write right after the grant, off the
// hand-off's path). Holder waits for that write, up to 2 s, while the
// lowest node still reads as an unclaimed ticket ("<identity>/waiting",
// returned as the Owner if the wait runs out); a ticket that a backend
// created for one of its owners and then granted to another of its owners
// names the first until the write lands.
//
// Errors: driver.ErrNotHeld when no node is queued; ErrClosed;
// go-zookeeper's errors, wrapped; ctx's error, wrapped.
func (b *Backend) Holder(ctx context.Context, name string) (driver.Holder, error) {
	parent := ParentPath(b.o.Root, name)
	var h driver.Holder
	err := b.async(ctx, "holder", name, func() error {
		var err error
		h, err = b.holder(ctx, name, parent)
		return err
	})
	if err != nil {
		// h is not read: when ctx ended first, the call is still running
		// and will write it.
		return driver.Holder{}, err
	}
	return h, nil
}

func (b *Backend) holder(ctx context.Context, name, parent string) (driver.Holder, error) {
	waitUntil := time.Now().Add(maxHolderWait)
	for {
		if _, err := b.conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return driver.Holder{}, fmt.Errorf("zklease: holder %q: sync: %w", name, err)
		}
		names, _, err := b.conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) || (err == nil && len(names) == 0) {
			return driver.Holder{}, fmt.Errorf("%w: %q: no node is queued", driver.ErrNotHeld, name)
		}
		if err != nil {
			return driver.Holder{}, fmt.Errorf("zklease: holder %q: list: %w", name, err)
		}
		kids, err := parseChildren(parent, names)
		if err != nil {
			return driver.Holder{}, err
		}
		data, st, ch, err := b.conn.GetW(parent + "/" + kids[0].name)
		if errors.Is(err, zk.ErrNoNode) {
			continue // released between the listing and the read
		}
		if err != nil {
			return driver.Holder{}, fmt.Errorf("zklease: holder %q: read: %w", name, err)
		}
		h := driver.Holder{Name: name, Owner: nodeOwner(data), Token: fenceToken(st.Czxid)}
		if !strings.HasSuffix(h.Owner, waitingSuffix) || !time.Now().Before(waitUntil) {
			return h, nil
		}
		select {
		case <-ch: // written with its owner, or deleted: read again
		case <-time.After(time.Until(waitUntil)):
		case <-ctx.Done():
			return driver.Holder{}, ctxErr("holder", name, ctx)
		case <-b.closed:
			return driver.Holder{}, ErrClosed
		}
	}
}
