package redislease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/lease"
)

// WithSlotReload gives the tests the Cluster client wrapper that New does
// not apply yet (see withSlotReload).
var WithSlotReload = withSlotReload

// SlotOf gives the tests the hash slot function of the sharded hub.
var SlotOf = slotOf

// SetConfirmTimeoutForTest sets how long a waiter waits for a subscription
// to be confirmed, and returns a function that restores it.
func SetConfirmTimeoutForTest(d time.Duration) (restore func()) {
	old := confirmTimeout
	confirmTimeout = d
	return func() { confirmTimeout = old }
}

// ShardedBackend is a Backend as New will build it once release.lua
// publishes with SPUBLISH (sharded.go): its Release runs
// release_sharded.lua and its Watch goes through a hub in pubsubAuto mode.
// Everything else is the Backend's.
type ShardedBackend struct {
	*Backend
	hub *hub
}

// NewShardedForTest returns a ShardedBackend over c with the key prefix.
func NewShardedForTest(c Client, prefix string) (*ShardedBackend, error) {
	b, err := New(c, func(o *Options) { o.Prefix = prefix })
	if err != nil {
		return nil, err
	}
	raw := c
	if rc, ok := c.(*reloadingClient); ok {
		raw = rc.Client
	}
	return &ShardedBackend{Backend: b, hub: newHubMode(raw, pubsubAuto)}, nil
}

// Release is Backend.Release with release_sharded.lua.
func (s *ShardedBackend) Release(ctx context.Context, rec lease.Record) error {
	k := s.KeysFor(rec.Name)
	n, err := releaseShardedScript.Run(ctx, s.c, []string{k.Lease}, rec.Owner, k.Channel).Int64()
	if err != nil {
		return fmt.Errorf("redislease: release %q: %w", rec.Name, err)
	}
	if n != 1 {
		return lease.ErrNotHeld
	}
	return nil
}

// Watch subscribes through the sharded hub.
func (s *ShardedBackend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	return s.hub.watch(ctx, s.KeysFor(name).Channel)
}

// Close closes both hubs.
func (s *ShardedBackend) Close() error { return errors.Join(s.hub.close(), s.Backend.Close()) }

// PubSubKind reports what the hub resolved to: "sharded, per slot",
// "sharded", "classic", or "" before the first Watch.
func (s *ShardedBackend) PubSubKind() string {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	switch {
	case !s.hub.resolved:
		return ""
	case s.hub.perSlot:
		return "sharded, per slot"
	case s.hub.sharded:
		return "sharded"
	}
	return "classic"
}

// PubSubConns returns how many pub/sub connections the sharded hub has open.
func (s *ShardedBackend) PubSubConns() int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return len(s.hub.conns)
}
