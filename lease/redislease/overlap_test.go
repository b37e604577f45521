package redislease_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// holding is what one holder believed while it held a grant.
type holding struct {
	token       fence.Token
	acquiredAt  time.Time // when Acquire returned: the grant happened before
	lastBelief  time.Time // the latest time Err() said "held"
	maxDeadline time.Time // the latest Deadline() reported while held
	manager     string
	lost        bool
}

// workWhileHeld "works" under the lease l until end or until l ends,
// sampling Err() and Deadline() every millisecond into h (each, if not nil,
// runs before every sample), then releases l, and returns h with what the
// holder believed and whether the release found the lease lost.
func workWhileHeld(t *testing.T, ctx context.Context, l *lease.Lease, h holding, end time.Time, each func()) holding {
	for time.Now().Before(end) {
		if each != nil {
			each()
		}
		t0 := time.Now()
		d := l.Deadline()
		if l.Err() != nil {
			break
		}
		h.lastBelief = t0
		if d.After(h.maxDeadline) {
			h.maxDeadline = d
		}
		time.Sleep(time.Millisecond)
	}
	// The clock is read before Err, as in the loop: the belief is dated
	// no later than the moment Err said "held", so a goroutine held up
	// between the two cannot date it after a grant made meanwhile.
	if now := time.Now(); l.Err() == nil {
		// Released now: the belief ends at the start of Release.
		h.lastBelief = now
		if h.maxDeadline.After(h.lastBelief) {
			h.maxDeadline = h.lastBelief
		}
	}
	if err := l.Release(ctx); errors.Is(err, lease.ErrLost) {
		h.lost = true
	} else if err != nil {
		t.Errorf("Release: %v", err)
	}
	return h
}

// checkNoOverlap is the overlap checker of the exclusivity tests: holdings
// are the grants of one lease name, from any number of holders. It fails t
// if a token was granted twice, or if any holder believed it held the lease
// (Err() == nil), or reported a Deadline(), later than the moment a grant
// with a greater token had already been made (that grant's Acquire had
// returned). It returns how many holdings ended lost.
func checkNoOverlap(t *testing.T, holdings []holding) (lost int) {
	t.Helper()
	sort.Slice(holdings, func(i, j int) bool { return holdings[i].token < holdings[j].token })
	for i := range holdings {
		if i > 0 && holdings[i].token == holdings[i-1].token {
			t.Errorf("token %d granted twice", holdings[i].token)
		}
	}
	// earliest[i] is the earliest acquiredAt of any grant after i.
	earliest := make([]time.Time, len(holdings))
	for i := len(holdings) - 2; i >= 0; i-- {
		next := holdings[i+1].acquiredAt
		if i+2 < len(holdings) && earliest[i+1].Before(next) {
			next = earliest[i+1]
		}
		earliest[i] = next
	}
	var failures int
	for i, h := range holdings {
		if h.lost {
			lost++
		}
		if i == len(holdings)-1 {
			break
		}
		if h.lastBelief.After(earliest[i]) || h.maxDeadline.After(earliest[i]) {
			failures++
			if failures <= 5 {
				t.Errorf("holder of token %d (%s) believed it held the lease %v after a later grant, and reported a deadline %v after it",
					h.token, h.manager, h.lastBelief.Sub(earliest[i]), h.maxDeadline.Sub(earliest[i]))
			}
		}
	}
	return lost
}
