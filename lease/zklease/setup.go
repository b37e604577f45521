package zklease

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/lease/driver"
)

var _ driver.Checker = (*Backend)(nil)

// setup returns err as an error matching driver.ErrSetup when it is one that
// retrying cannot fix, naming the fix, and err otherwise:
//
//   - zk.ErrNoAuth: an ACL on the root (or below it) refuses this client;
//   - zk.ErrAuthFailed: the servers refused the client's authentication;
//   - zk.ErrInvalidACL: the servers refuse Options.ACL.
//
// A missing root is not one: the backend creates it (and its missing
// ancestors). Connection losses, session expiry and the rest are returned
// as they are.
func (b *Backend) setup(err error) error {
	if err == nil || errors.Is(err, driver.ErrSetup) {
		return err
	}
	switch {
	case errors.Is(err, zk.ErrNoAuth):
		return &driver.SetupError{Err: err, Fix: fmt.Sprintf("a ZooKeeper ACL refuses this client on the root %s, or on its deepest existing ancestor when it is missing: zklease sends no credentials, so it is world:anyone; grant world:anyone cdrwa there with setAcl, or choose a root it may use with WithRoot, and keep Options.ACL open to world:anyone", b.o.Root)}
	case errors.Is(err, zk.ErrAuthFailed):
		return &driver.SetupError{Err: err, Fix: "the ZooKeeper servers refused the client's authentication: zklease sends no credentials, so the servers must accept unauthenticated clients (no required SASL)"}
	case errors.Is(err, zk.ErrInvalidACL):
		return &driver.SetupError{Err: err, Fix: "ZooKeeper refuses Options.ACL for the nodes zklease creates: set an ACL the servers accept, such as the default zk.WorldACL(zk.PermAll)"}
	}
	return err
}

// checkNode is the name of the node Check creates and deletes, in one
// transaction, under the root.
const checkNode = ".fencekit-check"

// Check implements driver.Checker: it waits for the client's session (ctx
// bounds the wait), then sends one transaction (Multi) that creates, with
// Options.ACL, the root's missing components and a node under the root,
// and deletes them all again, so that the servers check the permissions
// and the ACL the backend needs there (create and delete under the root's
// deepest existing node) and apply nothing: the tree is as it was,
// although the nodes' zxids and the parent's child version move on.
//
// An ACL that refuses this client, refused authentication and an ACL the
// servers refuse give an error matching driver.ErrSetup that names the
// fix; an ensemble that cannot be reached gives ctx's error.
func (b *Backend) Check(ctx context.Context) error {
	if err := b.Ready(ctx); err != nil {
		return fmt.Errorf("zklease: check: %w", err)
	}
	err := b.async(ctx, "check", b.o.Root, func() error {
		// The root's components, the deepest existing one first found.
		var paths []string
		p := ""
		for _, c := range strings.Split(b.o.Root[1:], "/") {
			p += "/" + c
			paths = append(paths, p)
		}
		missing := len(paths)
		for missing > 0 {
			ok, _, err := b.conn.Exists(paths[missing-1])
			if err != nil {
				return fmt.Errorf("zklease: check: exists %s: %w", paths[missing-1], err)
			}
			if ok {
				break
			}
			missing--
		}
		create := append(paths[missing:], b.o.Root+"/"+checkNode)
		ops := make([]any, 0, 2*len(create))
		for _, p := range create {
			ops = append(ops, &zk.CreateRequest{Path: p, Acl: b.o.ACL, Flags: zk.FlagPersistent})
		}
		for i := len(create) - 1; i >= 0; i-- {
			ops = append(ops, &zk.DeleteRequest{Path: create[i], Version: -1})
		}
		res, err := b.conn.Multi(ops...)
		if err != nil {
			i, opErr := failedOp(res, err)
			if i >= 0 && i < len(ops) && opErr != nil {
				what := "create"
				path := ""
				switch op := ops[i].(type) {
				case *zk.CreateRequest:
					path = op.Path
				case *zk.DeleteRequest:
					what, path = "delete", op.Path
				}
				return fmt.Errorf("zklease: check: %s %s: %w", what, path, opErr)
			}
			return fmt.Errorf("zklease: check: %w", err)
		}
		return nil
	})
	return err // async applied setup
}
