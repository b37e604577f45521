package redislease

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// stateReloader is implemented by go-redis's *redis.ClusterClient: it
// reloads the client's map of which node serves which hash slot (in the
// background; concurrent requests are coalesced).
type stateReloader interface {
	ReloadState(ctx context.Context)
}

// withSlotReload returns c unchanged unless it is a Redis Cluster client
// (it has ReloadState); then it returns c wrapped so that a request that
// failed without a reply from Redis (a refused or failed dial, a timeout, a
// broken connection) makes the client reload its slot map.
//
// Why: go-redis v9 reloads the slot map only after a MOVED or READONLY reply,
// or every ClusterStateReloadInterval (60 s by default since v9.22). When a
// master dies, the requests for its slots go on being sent to its address;
// they are refused there and never meet the MOVED that would correct the
// map (go-redis issue #3979; measured here: lease requests kept failing for
// 30 s after a replica had taken over). A reload after each failed request
// finds the promoted replica as soon as the cluster has promoted it. The
// reload runs in the background and is coalesced (go-redis sends one
// CLUSTER SLOTS at a time, at most one every 200 ms), so an outage costs a
// few reloads, not one per request. A failure with a reply (a Redis error,
// MOVED included: go-redis handles that itself) reloads nothing.
func withSlotReload(c Client) Client {
	if _, done := c.(*reloadingClient); done {
		return c
	}
	r, ok := c.(stateReloader)
	if !ok {
		return c
	}
	return &reloadingClient{Client: c, r: r}
}

// reloadingClient is a Client over a Redis Cluster client that reloads the
// slot map after a request failed without a reply. It overrides the calls
// the backend makes.
type reloadingClient struct {
	Client
	r stateReloader
}

// noReply reports whether err says a request got no reply from Redis: a
// failed dial, a timeout, a broken connection. Replies that are errors
// (redis.Error), and redis.Nil, are replies.
func noReply(err error) bool {
	var re redis.Error
	return err != nil && !errors.As(err, &re)
}

func (c *reloadingClient) check(ctx context.Context, err error) {
	if noReply(err) {
		c.r.ReloadState(context.WithoutCancel(ctx))
	}
}

func (c *reloadingClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Client.Eval(ctx, script, keys, args...)
	c.check(ctx, cmd.Err())
	return cmd
}

func (c *reloadingClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Client.EvalSha(ctx, sha1, keys, args...)
	c.check(ctx, cmd.Err())
	return cmd
}

func (c *reloadingClient) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Client.EvalRO(ctx, script, keys, args...)
	c.check(ctx, cmd.Err())
	return cmd
}

func (c *reloadingClient) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Client.EvalShaRO(ctx, sha1, keys, args...)
	c.check(ctx, cmd.Err())
	return cmd
}

func (c *reloadingClient) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	cmds, err := c.Client.Pipelined(ctx, fn)
	for _, cmd := range cmds {
		if noReply(cmd.Err()) {
			c.check(ctx, cmd.Err())
			break
		}
	}
	return cmds, err
}
