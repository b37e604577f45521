package memlease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fencekit/lease/driver"
)

var (
	_ driver.Lister  = (*Backend)(nil)
	_ driver.Revoker = (*Backend)(nil)
)

// status returns the status of name; mu must be held.
func (b *Backend) status(name string, now time.Time) driver.Status {
	st := driver.Status{Name: name, Waiters: len(b.line(name, now))}
	if g, ok := b.current(name, now); ok {
		st.Holder = driver.Holder{Name: name, Owner: g.owner, Token: g.token, Remaining: g.expires.Sub(now)}
	}
	return st
}

// List implements driver.Lister.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var names []string
	for name := range b.leases {
		names = append(names, name)
	}
	for name := range b.lines {
		if _, held := b.leases[name]; !held {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var out []driver.Status
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		if st := b.status(name, now); st.Held() || st.Waiters > 0 {
			out = append(out, st)
		}
	}
	return out, nil
}

// Status implements driver.Lister.
func (b *Backend) Status(ctx context.Context, name string) (driver.Status, error) {
	if err := driver.ValidateName(name); err != nil {
		return driver.Status{}, err
	}
	if err := ctx.Err(); err != nil {
		return driver.Status{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status(name, time.Now()), nil
}

// Revoke implements driver.Revoker: the owner is recorded as ended by a
// loss, so its Release returns driver.ErrNotHeld.
func (b *Backend) Revoke(ctx context.Context, h driver.Holder) error {
	if err := driver.CheckRevoke(h); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	cur, ok := b.current(h.Name, now)
	if !ok || cur.owner != h.Owner || cur.token != h.Token {
		return fmt.Errorf("%w: %q is not held by %q with token %d", driver.ErrNotHeld, h.Name, h.Owner, h.Token)
	}
	b.end(h.Name, h.Owner, h.Remaining, false, now) // kept driver.RevokedOwnerTTL(h)
	b.free(h.Name)
	return nil
}
