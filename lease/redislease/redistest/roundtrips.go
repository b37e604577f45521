package redistest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips is a go-redis hook that counts the round trips a client makes
// for its callers: one per command sent on its own (a script's EVALSHA that
// falls back to EVAL counts two), one per pipeline however many commands it
// carries. Not counted: the handshake go-redis makes on each new connection
// (HELLO, then a pipeline of CLIENT SETINFO) and a cluster client's own
// discovery (CLUSTER SLOTS, COMMAND, READONLY); pub/sub connections do not
// pass through client hooks. The zero value counts from zero; add it with
// AddHook, to a cluster client's node clients through
// ClusterOptions.NewClient.
type RoundTrips struct{ n atomic.Int64 }

var _ redis.Hook = (*RoundTrips)(nil)

// Load returns the number of round trips counted so far.
func (r *RoundTrips) Load() int64 { return r.n.Load() }

// DialHook implements redis.Hook; dials are not counted.
func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !uncounted(cmd) {
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !uncounted(c) }) {
			r.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// uncounted reports whether cmd is one go-redis sends on its own: to set
// up a new connection, or to find its way around a cluster.
func uncounted(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "cluster", "command", "readonly":
		return true
	case "client":
		args := cmd.Args()
		return len(args) > 1 && strings.EqualFold(fmt.Sprint(args[1]), "setinfo")
	}
	return false
}
