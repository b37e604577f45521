package etcdlease

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencekit/fencekit/lease/driver"
)

// setup returns err as an error matching driver.ErrSetup when it is one that
// retrying cannot fix, naming the fix, and err otherwise:
//
//   - authentication failed (a wrong user name or password);
//   - user name is empty, invalid auth token (authentication is enabled
//     and the client sends no credentials, or none that etcd accepts);
//   - permission denied (the user's roles do not cover the prefix).
//
// Unavailable (no leader, a broken connection), timeouts and every other
// error are returned as they are.
func (b *Backend) setup(err error) error {
	if err == nil || errors.Is(err, driver.ErrSetup) {
		return err
	}
	ee, code := etcdError(err)
	switch {
	case ee == rpctypes.ErrAuthFailed:
		return &driver.SetupError{Err: err, Fix: "etcd refused the user name or password: set the right Username and Password in the client's clientv3.Config"}
	case ee == rpctypes.ErrUserEmpty, ee == rpctypes.ErrInvalidAuthToken, code == codes.Unauthenticated:
		return &driver.SetupError{Err: err, Fix: "etcd has authentication enabled and the client sent no credentials it accepts: set Username and Password in the client's clientv3.Config"}
	case ee == rpctypes.ErrPermissionDenied, code == codes.PermissionDenied:
		return &driver.SetupError{Err: err, Fix: fmt.Sprintf("the etcd user's roles do not cover fencekit's keys: grant one of its roles readwrite on the prefix, etcdctl role grant-permission <role> --prefix=true readwrite %q", b.o.Prefix)}
	}
	return err
}

// etcdError returns the etcd error in err's chain (the zero EtcdError if
// none) and its gRPC code, converting a gRPC status error that a client
// wrapper passed on as it was.
func etcdError(err error) (rpctypes.EtcdError, codes.Code) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee, ee.Code()
	}
	st, ok := status.FromError(err)
	if !ok {
		return ee, codes.Unknown
	}
	if e, ok := rpctypes.Error(st.Err()).(rpctypes.EtcdError); ok {
		ee = e
	}
	return ee, st.Code()
}

// checkName is the lease name whose keys Check names in its permission
// probe; it reads and writes neither.
const checkName = "fencekit-check"

// Check implements driver.Checker in one round trip: a transaction whose
// condition can never hold (a create revision below 0), with puts of a
// lease key and an ended-owner key under the prefix in its never-taken
// branch, and a count of the keys under the prefix in the other. etcd
// checks the permissions of both branches, applies the transaction
// through raft (so a cluster without a quorum does not pass) and, as
// nothing is written, leaves the revision as it was: it reads the prefix,
// writes nothing and grants no etcd lease.
//
// Refused credentials and permissions give an error matching
// driver.ErrSetup that names the fix; a cluster that cannot be reached
// gives the client's error.
func (b *Backend) Check(ctx context.Context) error {
	if b.isClosed() {
		return ErrClosed
	}
	probe := b.Key(checkName)
	_, err := b.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(probe), "<", 0)).
		Then(clientv3.OpPut(probe, ""), clientv3.OpPut(b.EndedKey(checkName, "check"), "")).
		Else(clientv3.OpGet(b.o.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdlease: check: %w", b.setup(err))
	}
	return nil
}
