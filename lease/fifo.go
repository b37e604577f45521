package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/lease/driver"
)

// The Manager's side of FIFO hand-off (Options.FIFO, the package doc's
// "Waiting in line"): a blocked Acquire sends its attempts with
// Request.Queue set, so that the store keeps its place in line, and tells
// the store when it gives up (Backend.Abandon), so that the waiter behind
// it is next at once. The line itself, its order and the hand-off are the
// backend's (driver package doc, "Waiters in line").

// validateFIFO reports why Options.FIFO cannot be served, each problem
// matching ErrInvalidOptions.
func (o Options) validateFIFO(b Backend, lim driver.Limits) []error {
	if !o.FIFO || b == nil {
		return nil
	}
	var errs []error
	if !lim.Queues {
		errs = append(errs, fmt.Errorf("%w: FIFO needs a backend that keeps waiters in line at the store (driver.Limits.Queues), and %T does not: %w",
			ErrInvalidOptions, b, errors.ErrUnsupported))
	}
	if o.TTL > 0 && o.PollInterval > o.TTL/2 {
		errs = append(errs, fmt.Errorf("%w: poll interval %v is too long for FIFO: a waiter keeps its place in line by asking again within its TTL, so it must be at most TTL/2 = %v",
			ErrInvalidOptions, o.PollInterval, o.TTL/2))
	}
	return errs
}

// waiterRequest is request for a blocked Acquire: with FIFO, each attempt
// also keeps the owner's place in line.
func (m *Manager) waiterRequest(name string) driver.Request {
	req := m.request(name)
	req.Queue = m.o.FIFO
	return req
}

// leaveLine gives up req.Owner's place in line when a FIFO Acquire ends
// with err: Abandon removes the place, so that the waiter behind is next
// at once instead of after the place lapses (one TTL). It is bounded by
// PollInterval (at least 50 ms, at most ReleaseTimeout) and runs even when
// ctx is done; a failure is logged, and the place then lapses by itself.
// A store not set up for leases (ErrSetup) holds no place.
func (m *Manager) leaveLine(ctx context.Context, req driver.Request, err error) {
	if err == nil || !req.Queue || errors.Is(err, ErrSetup) || errors.Is(err, ErrInvalidName) {
		return
	}
	if aerr := m.e.abandon(ctx, req, m.o.PollInterval); aerr != nil {
		m.o.Logger.Warn("lease: could not leave the line of waiters; the place lapses after its TTL", "name", req.Name, "owner", req.Owner, "err", aerr)
	}
}
