package fencewire

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
)

// The problem types a receiver answers with, as RFC 9457 problem type URIs
// (URNs: they name the problem, nothing is fetched from them), with the
// HTTP status each goes with.
const (
	// ProblemStale (HTTP 409 Conflict, gRPC FailedPrecondition): the
	// receiver has accepted a newer token for the resource; the request
	// was not processed. Resource, Presented and Current are set.
	ProblemStale = "urn:fencekit:problem:stale-token"
	// ProblemMalformed (HTTP 400, gRPC InvalidArgument): the field is not
	// in this format, or is repeated. Detail says what is wrong.
	ProblemMalformed = "urn:fencekit:problem:malformed-token"
	// ProblemMissing (HTTP 400, gRPC InvalidArgument): the route requires
	// a fencing token and the request carries none.
	ProblemMissing = "urn:fencekit:problem:missing-token"
	// ProblemUnavailable (HTTP 503, gRPC Unavailable): the receiver could
	// not check the token (its checker's store failed); the request was
	// not processed. The token may or may not have been recorded.
	ProblemUnavailable = "urn:fencekit:problem:check-unavailable"
	// ProblemTokenRange (HTTP 422 Unprocessable Content, gRPC OutOfRange):
	// the token is valid on the wire but beyond what the receiver's
	// checker can store (fencecheck.ErrTokenRange); the request was not
	// processed and nothing was recorded. Resource and Presented are set.
	// Sending it again will not help: the sender's token source and the
	// receiver's checker do not fit together.
	ProblemTokenRange = "urn:fencekit:problem:token-out-of-range"
)

// ProblemContentType is the media type of a Problem body (RFC 9457).
const ProblemContentType = "application/problem+json"

// ErrRejected is matched by the error a client gets for a request the
// receiver refused because of its fencing field (malformed, missing on a
// route that requires one, or a token beyond what the receiver can store,
// which also matches fencecheck.ErrTokenRange). A stale token is reported
// as a *fence.StaleError instead.
var ErrRejected = errors.New("fencewire: fencing token refused by the receiver")

// ErrUnavailable is matched by the error a client gets when the receiver
// could not check the token; the request was not processed.
var ErrUnavailable = errors.New("fencewire: the receiver could not check the fencing token")

// Problem is the machine-readable body of a refusal: an RFC 9457 problem
// details object with three extension members. Tokens are decimal strings,
// because JSON numbers lose precision above 2^53 in many decoders.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Resource, Presented and Current name the resource, the token the
	// request carried and the newest token the receiver had accepted
	// (ProblemStale; Current is "0" when the receiver could not learn it).
	Resource  string `json:"resource,omitempty"`
	Presented string `json:"presented,omitempty"`
	Current   string `json:"current,omitempty"`
}

// TokenRangeProblem returns the Problem for a valid token that the
// receiver's checker cannot store (fencecheck.ErrTokenRange); detail says
// why.
func TokenRangeProblem(v Value, detail string) Problem {
	return Problem{
		Type: ProblemTokenRange, Title: "fencing token out of the receiver's range", Status: 422,
		Detail: detail, Resource: v.Resource, Presented: v.Token.String(),
	}
}

// StaleProblem returns the Problem for a *fence.StaleError.
func StaleProblem(se *fence.StaleError) Problem {
	return Problem{
		Type: ProblemStale, Title: "stale fencing token", Status: 409,
		Detail:   se.Error(),
		Resource: se.Resource, Presented: se.Presented.String(), Current: se.Current.String(),
	}
}

// Err returns the error a client reports for p: a *fence.StaleError
// (matching fence.ErrStaleToken) naming the resource and both tokens for
// ProblemStale; an error matching ErrRejected (and ErrMalformed for
// ProblemMalformed) for a malformed or missing field; one matching
// ErrUnavailable for ProblemUnavailable; one matching ErrRejected and
// fencecheck.ErrTokenRange for ProblemTokenRange; nil for any other type,
// which is not a fencing problem.
func (p Problem) Err() error {
	switch p.Type {
	case ProblemStale:
		presented, _ := strconv.ParseUint(p.Presented, 10, 64)
		current, _ := strconv.ParseUint(p.Current, 10, 64)
		return fence.Stale(p.Resource, fence.Token(presented), fence.Token(current))
	case ProblemMalformed:
		return fmt.Errorf("%w: %w: %s", ErrRejected, ErrMalformed, p.Detail)
	case ProblemMissing:
		return fmt.Errorf("%w: the receiver requires a fencing token: %s", ErrRejected, p.Detail)
	case ProblemUnavailable:
		return fmt.Errorf("%w: %s", ErrUnavailable, p.Detail)
	case ProblemTokenRange:
		return fmt.Errorf("%w: %w: %s", ErrRejected, fencecheck.ErrTokenRange, p.Detail)
	}
	return nil
}
