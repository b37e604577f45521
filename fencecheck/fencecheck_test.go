package fencecheck_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencecheck/checktest"
	"github.com/fencekit/fencekit/guardtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMemoryConformance(t *testing.T) {
	checktest.Run(t, checktest.Config{
		New: func(t *testing.T) (fencecheck.Checker, func(context.Context, string) (fence.Token, error)) {
			m := fencecheck.NewMemory()
			return m, func(_ context.Context, r string) (fence.Token, error) { return m.Current(r), nil }
		},
	})
}

// memoryState is a service's own state kept with Memory.Do: the guard
// contract holds for it (the value and the token change together).
type memoryState struct {
	m     *fencecheck.Memory
	name  string
	mu    sync.Mutex
	value string
}

func (s *memoryState) Write(ctx context.Context, tok fence.Token, v string) error {
	return s.m.Do(ctx, s.name, tok, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.value = v
		return nil
	})
}

func (s *memoryState) Read(context.Context) (string, fence.Token, error) {
	tok := s.m.Current(s.name) // waits for a running Do
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.value, tok, nil
}

func TestMemoryDoGuardConformance(t *testing.T) {
	guardtest.Run(t, guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource {
			return &memoryState{m: fencecheck.NewMemory(), name: t.Name()}
		},
		Lacks: map[guardtest.Capability]string{
			guardtest.Missing:   "a checked resource exists once named",
			guardtest.LoseReply: "in memory: no reply to lose",
			guardtest.CountIO:   "in memory: no I/O",
			guardtest.Observer:  "a checker reports through the transport that runs it (fencehttp.Handler, fencegrpc.Server)",
			guardtest.Setup:     "in memory: nothing to set up",
		},
	})
}

func TestMemoryDoKeepsTheTokenOnlyIfFnSucceeds(t *testing.T) {
	m := fencecheck.NewMemory()
	ctx := t.Context()
	boom := errors.New("boom")
	if err := m.Do(ctx, "r", 5, func() error { return boom }); err != boom {
		t.Fatalf("Do = %v; want fn's error as it is", err)
	}
	if got := m.Current("r"); got != fence.None {
		t.Fatalf("a failed Do recorded token %d", got)
	}
}

func TestMemoryDoHoldsTheResource(t *testing.T) {
	m := fencecheck.NewMemory()
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- m.Do(context.Background(), "r", 7, func() error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	// A Check of the same resource waits; with a context that ends, it
	// gives up without recording anything.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := m.Check(ctx, "r", 9); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check during Do = %v; want the context's error", err)
	}
	// Another resource does not wait.
	if err := m.Check(t.Context(), "other", 1); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := m.Current("r"); got != 7 {
		t.Fatalf("Current = %d; want 7 (the timed-out check recorded nothing)", got)
	}
}
