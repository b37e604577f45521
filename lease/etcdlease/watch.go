package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/lease"
)

// Watch implements lease.Watcher: an etcd watch on the lease's key, for
// deletions only (a release, an expiry, a revoke). It returns once etcd
// has confirmed that the watch is created, bounded by ctx. The watch
// requires a leader: when the member the client talks to loses its leader,
// the watch ends, and the waiter is signalled once so that it tries again
// (and then polls).
func (b *Backend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	if err := lease.ValidateName(name); err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, nil, ErrClosed
	}
	b.wg.Add(1)
	b.mu.Unlock()

	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(b.ctx))
	wch := b.c.Watch(wctx, b.Key(name), clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	fail := func(err error) (<-chan struct{}, func(), error) {
		cancel()
		for range wch { // the client closes it once the cancel is through
		}
		b.wg.Done()
		return nil, nil, err
	}
	select {
	case resp, ok := <-wch:
		switch {
		case !ok:
			return fail(fmt.Errorf("etcdlease: watch %q: the watch ended before it was created: %w", name, errors.Join(wctx.Err(), ErrClosed)))
		case resp.Err() != nil:
			return fail(fmt.Errorf("etcdlease: watch %q: %w", name, resp.Err()))
		case !resp.Created:
			return fail(fmt.Errorf("etcdlease: watch %q: the first response did not confirm the watch", name))
		}
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	signals := make(chan struct{}, 1)
	signal := func() {
		select {
		case signals <- struct{}{}:
		default:
		}
	}
	done := make(chan struct{})
	go func() {
		defer b.wg.Done()
		defer close(done)
		for resp := range wch {
			if len(resp.Events) > 0 || resp.Err() != nil || resp.Canceled {
				signal()
			}
		}
		// The watch ended (lost leader, closed client): one last signal,
		// so that the waiter looks again rather than waiting for a poll.
		if wctx.Err() == nil {
			signal()
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	return signals, stop, nil
}

// heldWatch watches a held grant's key, so that a loss the store makes (an
// expiry, a revoke, a deletion) ends the lease at once.
type heldWatch struct {
	releasing atomic.Bool // set by Release before it revokes: the deletion to come is its own
	cancel    context.CancelFunc
}

// heldRetry is the pause before a held grant's watch is made again after it
// ended without news (the client reconnecting, say).
const heldRetry = 100 * time.Millisecond

// watchHeld starts watching st's key from the revision after its creation:
// a deletion, or a put by anyone else, that happens after the grant is seen
// even if the watch is created later. It ends when the loss is reported,
// when Release stops it, or when the backend closes.
func (b *Backend) watchHeld(st *grantState, n lease.Notifier) *heldWatch {
	ctx, cancel := context.WithCancel(b.ctx)
	h := &heldWatch{cancel: cancel}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		return h
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		from := st.rev + 1
		for {
			next, cause := b.followHeld(ctx, st, from)
			if cause != nil && !h.releasing.Load() {
				n.Lost(cause)
			}
			if cause != nil || ctx.Err() != nil {
				return
			}
			from = next
			select {
			case <-ctx.Done():
				return
			case <-time.After(heldRetry):
			}
		}
	}()
	return h
}

// followHeld watches st's key from revision from until the watch ends. It
// returns the revision to watch from next, and the cause of a loss if the
// key was deleted or overwritten.
func (b *Backend) followHeld(ctx context.Context, st *grantState, from int64) (next int64, lost error) {
	ctx, cancel := context.WithCancel(ctx)
	wch := b.c.Watch(ctx, st.key, clientv3.WithRev(from))
	defer func() {
		cancel()
		for range wch { // closed by the client once the cancel is through
		}
	}()
	for resp := range wch {
		if resp.CompactRevision > 0 {
			// The history from "from" on is compacted: look at the key as
			// it is now, and watch on from there.
			next, err := b.checkHeld(ctx, st)
			if errors.Is(err, lease.ErrNotHeld) {
				return from, err
			}
			if err == nil {
				from = next
			}
			return from, nil
		}
		for _, ev := range resp.Events {
			from = ev.Kv.ModRevision + 1
			switch {
			case ev.Type == mvccpb.DELETE:
				return from, fmt.Errorf("%w: %q: its key was deleted at revision %d (the etcd lease expired or was revoked, or the key was deleted)", lease.ErrNotHeld, st.key, ev.Kv.ModRevision)
			case ev.Kv.CreateRevision != st.rev || clientv3.LeaseID(ev.Kv.Lease) != st.id || string(ev.Kv.Value) != st.owner:
				return from, fmt.Errorf("%w: %q: its key was overwritten at revision %d", lease.ErrNotHeld, st.key, ev.Kv.ModRevision)
			}
		}
	}
	return from, nil
}

// checkHeld reads st's key and returns the revision to watch from, or an
// error matching lease.ErrNotHeld if the key is no longer st's.
func (b *Backend) checkHeld(ctx context.Context, st *grantState) (int64, error) {
	resp, err := b.c.Get(ctx, st.key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != st.rev || clientv3.LeaseID(resp.Kvs[0].Lease) != st.id {
		return 0, fmt.Errorf("%w: %q: the key is gone or another grant's", lease.ErrNotHeld, st.key)
	}
	return resp.Header.Revision + 1, nil
}
