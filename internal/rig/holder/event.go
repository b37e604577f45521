// Package holder is the output of the holder program
// (internal/rig/cmd/holder), one JSON Event a line, shared by the
// program and the tests that read it.
package holder

import (
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Event kinds, in the order a holder reports them.
const (
	KindWaiting     = "waiting"      // stores set up; about to Acquire
	KindAcquired    = "acquired"     // Token, Sent, Deadline
	KindRenewed     = "renewed"      // Token, Sent, Deadline
	KindRenewFailed = "renew-failed" // Token, Sent, Text
	KindChecked     = "checked"      // Token, Valid, Deadline, Text (the lease's error)
	KindWrite       = "write"        // one fenced write: Store, Outcome, ...
	KindLost        = "lost"         // the lease ended otherwise than by Release: Text
	KindReleased    = "released"     // Token, Text (Release's error, if any)
	KindFailed      = "failed"       // setup, Acquire or a command failed: Text
)

// Write outcomes (Event.Outcome).
const (
	Accepted = "accepted"
	Stale    = "stale"   // refused with fence.ErrStaleToken
	Unknown  = "unknown" // fence.ErrOutcomeUnknown: it may or may not have landed
	Error    = "error"   // any other error
)

// Event is one line of the holder program's output.
type Event struct {
	At   time.Time `json:"at"`
	Pid  int       `json:"pid"`
	Role string    `json:"role,omitempty"` // the -role flag
	Kind string    `json:"kind"`
	// Token is the lease's fencing token.
	Token fence.Token `json:"token,omitempty"`
	// Sent is when the request that succeeded was sent: for acquired, the
	// granting request's send time (Deadline - TTL + SafetyMargin); for
	// renewed, the renew request's.
	Sent time.Time `json:"sent,omitzero"`
	// Deadline is the lease's local deadline.
	Deadline time.Time `json:"deadline,omitzero"`
	// Valid says whether the lease was valid at a check.
	Valid bool `json:"valid,omitempty"`

	// Store names the store a write went to: pg-row, pg-ledger and s3
	// (-ledger), postgres and s3 (-resource), dynamodb (-dynamo-data).
	Store string `json:"store,omitempty"`
	// Round counts the rounds of writes of -do rounds, from 0.
	Round int `json:"round,omitempty"`
	// Start and End bound the write call.
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
	// Outcome is one of Accepted, Stale, Unknown and Error.
	Outcome string `json:"outcome,omitempty"`
	// Current is the token the store had accepted, for a stale write that
	// carries it.
	Current fence.Token `json:"current,omitempty"`
	// Value is what the write wrote (-ledger).
	Value string `json:"value,omitempty"`
	Text  string `json:"text,omitempty"`
}
