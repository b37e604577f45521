package guardtest

import (
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

// WantSetup fails t (without stopping it) unless err is a setup error as
// every guard returns one: it matches fence.ErrSetup (the sentinel
// lease.ErrSetup is, so that a caller's retry loop stops), a
// *fence.SetupError in its chain names a fix, it is neither stale nor an
// unknown outcome, and it matches each of kinds and says each of says.
// what names the call in the message.
func WantSetup(t testing.TB, what string, err error, kinds []error, says ...string) {
	t.Helper()
	var se *fence.SetupError
	switch {
	case !errors.Is(err, fence.ErrSetup) || !errors.As(err, &se) || se.Fix == "":
		t.Errorf("%s: %v; want a *fence.SetupError with a fix, matching fence.ErrSetup (lease.ErrSetup)", what, err)
		return
	case errors.Is(err, fence.ErrStaleToken) || errors.Is(err, fence.ErrOutcomeUnknown):
		t.Errorf("%s: %v: a setup problem must be neither stale nor an unknown outcome", what, err)
	}
	for _, k := range kinds {
		if !errors.Is(err, k) {
			t.Errorf("%s: %v; want it to match %v", what, err, k)
		}
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %v; want it to say %q", what, err, s)
		}
	}
}
