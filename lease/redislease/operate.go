package redislease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Operating leases: driver.Lister and driver.Revoker.

var (
	_ driver.Lister  = (*Backend)(nil)
	_ driver.Revoker = (*Backend)(nil)
)

var (
	//go:embed status.lua
	statusSrc    string
	statusScript = redis.NewScript(statusSrc)
	//go:embed revoke.lua
	revokeSrc    string
	revokeScript = redis.NewScript(revokeSrc)
)

// ErrCannotScan is returned by List when the Client cannot scan the
// keyspace: it has neither SCAN (Scan) nor a Cluster client's
// ForEachMaster. Every go-redis client has them; a wrapper must pass them
// on.
var ErrCannotScan = errors.New("redislease: the client cannot scan the keyspace (it needs go-redis's Scan, or ForEachMaster on a Cluster)")

// scanner is the SCAN of a go-redis client.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// masters is a Cluster client's walk over its masters.
type masters interface {
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, c *redis.Client) error) error
}

// scanBatch is SCAN's COUNT: how many keys a server looks at per call.
const scanBatch = 1000

var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)

// List implements driver.Lister: SCAN (on every master of a Cluster) for
// the lease keys and the waiters' keys of the names under prefix
// ("<prefix>{<escaped name prefix>*"), then one read per name (Status). A
// Cluster's masters are scanned concurrently; a name whose keys move
// during a resharding may be missed or found twice (it is listed once).
// Errors: ErrCannotScan; the server's, wrapped.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Status, error) {
	match := globEscaper.Replace(b.prefix+"{"+nameEscaper.Replace(prefix)) + "*"
	var mu sync.Mutex // a Cluster's masters are scanned concurrently
	names := make(map[string]bool)
	scan := func(ctx context.Context, s scanner) error {
		var cursor uint64
		for {
			keys, next, err := s.Scan(ctx, cursor, match, scanBatch).Result()
			if err != nil {
				return fmt.Errorf("redislease: list %q: scan: %w", prefix, b.setup(err))
			}
			for _, k := range keys {
				if name, ok := b.nameOf(k); ok && strings.HasPrefix(name, prefix) {
					mu.Lock()
					names[name] = true
					mu.Unlock()
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	c := b.c
	if rc, ok := c.(*reloadingClient); ok {
		c = rc.Client
	}
	var err error
	switch cc := c.(type) {
	case masters:
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	case scanner:
		err = scan(ctx, cc)
	default:
		err = ErrCannotScan
	}
	if err != nil {
		return nil, err
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	var out []driver.Status
	for _, n := range sorted {
		st, err := b.status(ctx, n)
		if err != nil {
			return nil, err
		}
		if st.Held() || st.Waiters > 0 {
			out = append(out, st)
		}
	}
	return out, nil
}

// nameOf returns the lease name of key when key is a lease key or a line's
// places key of this backend's prefix.
func (b *Backend) nameOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, b.prefix+"{")
	if !ok {
		return "", false
	}
	esc, suffix, ok := strings.Cut(rest, "}:")
	if !ok || (suffix != "lease" && suffix != "places") {
		return "", false
	}
	return nameUnescaper.Replace(esc), true
}

var nameUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// Status implements driver.Lister in one script call: the lease key, its
// time left (PTTL) and the live places of its line, read together.
func (b *Backend) Status(ctx context.Context, name string) (driver.Status, error) {
	if err := driver.ValidateName(name); err != nil {
		return driver.Status{}, err
	}
	return b.status(ctx, name)
}

func (b *Backend) status(ctx context.Context, name string) (driver.Status, error) {
	lk, places, _ := b.keys(name, "lease", "places", "")
	res, err := statusScript.Run(ctx, b.c, []string{lk, places}).Slice()
	if err != nil {
		return driver.Status{}, fmt.Errorf("redislease: status of %q: %w", name, b.setup(err))
	}
	if len(res) != 3 {
		return driver.Status{}, fmt.Errorf("redislease: status of %q: unexpected reply %v", name, res)
	}
	waiters, _ := res[2].(int64)
	st := driver.Status{Name: name, Waiters: int(waiters)}
	v, _ := res[0].(string)
	if v == "" {
		return st, nil
	}
	tokS, owner, ok := strings.Cut(v, ":")
	tok, perr := strconv.ParseUint(tokS, 10, 64)
	if !ok || perr != nil || tok == 0 {
		return driver.Status{}, fmt.Errorf("redislease: status of %q: the lease key holds %q, not a grant", name, v)
	}
	pttl, _ := res[1].(int64)
	st.Holder = driver.Holder{Name: name, Owner: owner, Token: fence.Token(tok), Remaining: time.Duration(max(pttl, 0)) * time.Millisecond}
	return st, nil
}

// Revoke implements driver.Revoker in one script call: it deletes the
// lease key if it still holds h's owner and token, leaves the owner's
// tombstone (value "lost", PX driver.RevokedOwnerTTL(h)) and publishes on
// the release channel, as Release does; the token counter stays.
func (b *Backend) Revoke(ctx context.Context, h driver.Holder) error {
	if err := driver.CheckRevoke(h); err != nil {
		return err
	}
	lk, ek, ch := b.keys(h.Name, "lease", endedSuffix+h.Owner, "released")
	ms := int64((driver.RevokedOwnerTTL(h) + time.Millisecond - 1) / time.Millisecond)
	value := grantValue(driver.Grant{Owner: h.Owner, Token: h.Token})
	n, err := revokeScript.Run(ctx, b.c, []string{lk, ek}, value, ch, b.notice, ms).Int64()
	if err != nil {
		return fmt.Errorf("redislease: revoke %q: %w", h.Name, b.setup(err))
	}
	if n != 1 {
		return fmt.Errorf("%w: %q is not held by %q with token %d", driver.ErrNotHeld, h.Name, h.Owner, h.Token)
	}
	return nil
}
