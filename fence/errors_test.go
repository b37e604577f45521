package fence_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

// A bad token is a bad argument, and nothing else: a caller that checks
// ErrInvalidArgument catches it, one that checks ErrInvalidToken catches
// only it.
func TestInvalidTokenIsAnInvalidArgument(t *testing.T) {
	err := fmt.Errorf("sqlguard: update: %w", fence.None.Validate())
	if !errors.Is(err, fence.ErrInvalidToken) || !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("%v: want ErrInvalidToken and ErrInvalidArgument", err)
	}
	if errors.Is(fmt.Errorf("x: %w", fence.ErrInvalidArgument), fence.ErrInvalidToken) {
		t.Fatal("ErrInvalidArgument matches ErrInvalidToken")
	}
	for _, e := range []error{fence.ErrSetup, fence.ErrStaleToken, fence.ErrOutcomeUnknown, fence.ErrRetryable} {
		if errors.Is(err, e) {
			t.Errorf("%v matches %v", err, e)
		}
	}
}

// Every kind of setup problem matches ErrSetup, by itself and inside a
// *SetupError, whose text carries the fix; and no kind matches another.
func TestSetupKinds(t *testing.T) {
	kinds := []error{fence.ErrNotMigrated, fence.ErrNoTable, fence.ErrNoLockVersion, fence.ErrLockVersionType, fence.ErrLedgerTable}
	for i, k := range kinds {
		if !errors.Is(k, fence.ErrSetup) {
			t.Errorf("%v does not match ErrSetup", k)
		}
		for j, other := range kinds {
			if i != j && errors.Is(k, other) {
				t.Errorf("%v matches %v", k, other)
			}
		}
		store := errors.New("relation does not exist")
		err := fmt.Errorf("guard: write: %w", fence.Setup("run the migration", "%w: t: %w", k, store))
		var se *fence.SetupError
		if !errors.Is(err, fence.ErrSetup) || !errors.Is(err, k) || !errors.Is(err, store) || !errors.As(err, &se) {
			t.Fatalf("%v: want ErrSetup, %v, the store's error and a *SetupError", err, k)
		}
		if want := "guard: write: " + k.Error() + ": t: relation does not exist (run the migration)"; err.Error() != want {
			t.Errorf("Error() = %q, want %q", err.Error(), want)
		}
	}
	if got := (&fence.SetupError{Fix: "create the bucket"}).Error(); got != "create the bucket" {
		t.Errorf("a SetupError without Err says %q, want its fix", got)
	}
	if errors.Is(fence.ErrSetup, fence.ErrRetryable) || errors.Is(&fence.SetupError{}, fence.ErrRetryable) {
		t.Error("a setup error matches ErrRetryable")
	}
}

func TestRetryableAndNotFound(t *testing.T) {
	cause := errors.New("deadlock")
	err := fmt.Errorf("w: %w", &fence.RetryableError{Op: "dbguard: update `t`", Err: cause})
	if !errors.Is(err, fence.ErrRetryable) || !errors.Is(err, cause) {
		t.Fatalf("%v: want ErrRetryable and its cause", err)
	}
	if want := "w: dbguard: update `t`: retryable: deadlock"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	nf := &fence.NotFoundError{Resource: "s3://b/k", Tombstone: 9}
	if !errors.Is(fmt.Errorf("get: %w", nf), fence.ErrNotFound) {
		t.Fatal("a *NotFoundError does not match ErrNotFound")
	}
	if want := "fence: not found: s3://b/k (deleted with token 9)"; nf.Error() != want {
		t.Errorf("Error() = %q, want %q", nf.Error(), want)
	}
	if want := "fence: not found: t(id=1)"; (&fence.NotFoundError{Resource: "t(id=1)"}).Error() != want {
		t.Errorf("Error() = %q", (&fence.NotFoundError{Resource: "t(id=1)"}).Error())
	}
}
