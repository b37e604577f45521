package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Operating leases: driver.Lister and driver.Revoker.

var (
	_ driver.Lister  = (*Backend)(nil)
	_ driver.Revoker = (*Backend)(nil)
)

// List implements driver.Lister: one range read of the lease keys and the
// places in line under the prefix (keys only, in one transaction), then
// Status per name.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Status, error) {
	lk, wk := b.o.Prefix+"l/", b.o.Prefix+"w/"
	resp, err := b.c.Txn(ctx).Then(
		clientv3.OpGet(lk+prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(wk+prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcdlease: list %q: %w", prefix, b.setup(err))
	}
	var names []string
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		names = append(names, string(kv.Key[len(lk):]))
	}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		// A place is LineKey(name, owner): the name ends at the NUL.
		if name, _, ok := strings.Cut(string(kv.Key[len(wk):]), "\x00"); ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var out []driver.Status
	for _, n := range slices.Compact(names) {
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

// Status implements driver.Lister: Holder (two round trips) and a count of
// the places in line (one).
func (b *Backend) Status(ctx context.Context, name string) (driver.Status, error) {
	if err := driver.ValidateName(name); err != nil {
		return driver.Status{}, err
	}
	st := driver.Status{Name: name}
	h, err := b.Holder(ctx, name)
	switch {
	case err == nil:
		st.Holder = h
	case !errors.Is(err, driver.ErrNotHeld):
		return driver.Status{}, err
	}
	resp, err := b.c.Get(ctx, b.linePrefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return driver.Status{}, fmt.Errorf("etcdlease: status of %q: %w", name, b.setup(err))
	}
	st.Waiters = int(resp.Count)
	return st, nil
}

// endedRevoked is the ended record of a revoked owner: its Release then
// answers driver.ErrNotHeld, as after a loss.
const endedRevoked = endedLost

// Revoke implements driver.Revoker in two round trips: a read of the key
// and the epoch key (the grant's revision is its token less the epoch's
// base), then one transaction that, if the key still holds h.Owner at
// that revision and the epoch is the same, deletes it and records the
// owner as ended (EndedKey, "lost", for driver.RevokedOwnerTTL(h)). The
// grant's etcd lease is then revoked in the background. The holder's
// Backend watches its key and ends the lease at once; waiters watching the
// key wake. A transaction whose outcome stays unknown is sent again, as
// Release does; if a resent one finds the grant gone and the owner
// recorded, the error says the outcome is unknown.
func (b *Backend) Revoke(ctx context.Context, h driver.Holder) error {
	if err := driver.CheckRevoke(h); err != nil {
		return err
	}
	key, endKey := b.Key(h.Name), b.EndedKey(h.Name, h.Owner)
	notHeld := fmt.Errorf("%w: %q is not held by %q with token %d", driver.ErrNotHeld, h.Name, h.Owner, h.Token)
	read, err := b.c.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(b.epochKey)).Commit()
	if err != nil {
		return fmt.Errorf("etcdlease: revoke %q: %w", h.Name, b.setup(err))
	}
	kvs, eps := read.Responses[0].GetResponseRange().GetKvs(), read.Responses[1].GetResponseRange().GetKvs()
	if len(kvs) == 0 || len(eps) == 0 || string(kvs[0].Value) != h.Owner {
		return notHeld
	}
	if tok, err := b.tokenOf(kvs[0], eps[0]); err != nil {
		return fmt.Errorf("etcdlease: revoke %q: %w", h.Name, err)
	} else if tok != h.Token {
		return notHeld
	}
	var (
		resp     *clientv3.TxnResponse
		attempts int
	)
	err = b.endOwner(ctx, h.Remaining, func(tomb clientv3.LeaseID) (err error) {
		attempts++
		resp, err = b.c.Txn(ctx).If(
			clientv3.Compare(clientv3.Value(key), "=", h.Owner),
			clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision),
			clientv3.Compare(clientv3.Value(b.epochKey), "=", string(eps[0].Value)),
			clientv3.Compare(clientv3.ModRevision(b.epochKey), "=", eps[0].ModRevision),
		).Then(
			clientv3.OpDelete(key),
			clientv3.OpPut(endKey, endedRevoked, clientv3.WithLease(tomb)),
		).Else(clientv3.OpGet(endKey, clientv3.WithCountOnly())).Commit()
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("etcdlease: revoke %q: %w", h.Name, b.setup(err))
	case resp.Succeeded:
		if kvs[0].Lease != 0 {
			b.revokeInBackground(clientv3.LeaseID(kvs[0].Lease))
		}
		return nil
	case attempts > 1 && resp.Responses[0].GetResponseRange().GetCount() > 0:
		return fmt.Errorf("etcdlease: revoke %q: the outcome is unknown (an earlier attempt, whose reply was lost, may have revoked it): read the holder again", h.Name)
	}
	return notHeld
}

// tokenOf is the token of the grant kv under the epoch key ep (as Holder
// computes it).
func (b *Backend) tokenOf(kv, ep *mvccpb.KeyValue) (fence.Token, error) {
	if ep.CreateRevision > kv.ModRevision {
		return 0, fmt.Errorf("the key was created before the current epoch key (%q), so its token cannot be told", b.epochKey)
	}
	us, err := strconv.ParseInt(string(ep.Value), 10, 64)
	if err != nil || us <= ep.CreateRevision {
		return 0, fmt.Errorf("%w: %q holds %.40q", ErrCorruptEpoch, b.epochKey, ep.Value)
	}
	return fence.Token(us - ep.CreateRevision + kv.ModRevision), nil
}
