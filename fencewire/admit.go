package fencewire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
)

// Admit applies the receiver's rules of the specification to the field
// lines (HTTP) or metadata entries (gRPC) of one request, for transports
// (fencehttp.Handler, fencegrpc.Server) to share:
//
//   - no line: the request passes without a token (ok false, refusal
//     nil), unless require is set or checker is not nil (ProblemMissing);
//   - more than one line, or a malformed one: ProblemMalformed;
//   - with a checker: a stale token is ProblemStale; a valid token the
//     checker cannot store (fencecheck.ErrTokenRange) ProblemTokenRange;
//     a checker failure ProblemUnavailable (checkErr is the checker's
//     error, for the receiver's log: it is not sent);
//   - otherwise the request passes with v (ok true).
//
// ctx bounds the check.
func Admit(ctx context.Context, lines []string, require bool, checker fencecheck.Checker) (v Value, ok bool, refusal *Problem, checkErr error) {
	switch {
	case len(lines) == 0 && (require || checker != nil):
		return Value{}, false, &Problem{Type: ProblemMissing, Title: "fencing token required", Status: 400,
			Detail: "this route requires a " + HeaderName + " field"}, nil
	case len(lines) == 0:
		return Value{}, false, nil, nil
	case len(lines) > 1:
		return Value{}, false, malformed(fmt.Sprintf("%d %s field lines; exactly one is allowed", len(lines), HeaderName)), nil
	}
	v, err := Parse(lines[0])
	if err != nil {
		return Value{}, false, malformed(err.Error()), nil
	}
	if checker == nil {
		return v, true, nil, nil
	}
	err = checker.Check(ctx, v.Resource, v.Token)
	var se *fence.StaleError
	switch {
	case err == nil:
		return v, true, nil, nil
	case errors.As(err, &se):
		p := StaleProblem(se)
		return Value{}, false, &p, nil
	case errors.Is(err, fencecheck.ErrTokenRange):
		p := TokenRangeProblem(v, err.Error())
		return Value{}, false, &p, nil
	case errors.Is(err, fencecheck.ErrInvalidResource) || errors.Is(err, fence.ErrInvalidToken):
		return Value{}, false, malformed(err.Error()), nil
	}
	return Value{}, false, &Problem{Type: ProblemUnavailable, Title: "fencing token not checked", Status: 503,
		Detail: "the service could not check the fencing token; the request was not processed"}, err
}

func malformed(detail string) *Problem {
	return &Problem{Type: ProblemMalformed, Title: "malformed fencing token", Status: 400, Detail: detail}
}

// Peek returns the value of lines when they are one well-formed field
// line (or metadata entry), for an observer's event; the zero Value and
// false otherwise. It decides nothing: Admit does.
func Peek(lines []string) (Value, bool) {
	if len(lines) != 1 {
		return Value{}, false
	}
	v, err := Parse(lines[0])
	return v, err == nil
}

// Receiver is the receiving side that the transports share
// (fencehttp.Handler, fencegrpc.Server): the rules of Admit, the log of a
// checker's failure, and a fence.WriteEvent per call admitted or refused.
type Receiver struct {
	// Guard names the transport in events and log lines: "fencehttp",
	// "fencegrpc".
	Guard string
	// Require and Checker are Admit's.
	Require bool
	Checker fencecheck.Checker
	// Logger logs the checker's failures. Nil: slog.Default().
	Logger *slog.Logger
	// Observer, when set, receives an event for every call that carries
	// a token or is refused for lacking one: Guard, Class the class
	// Admit is given, Op "admit", the resource and token of a well-formed
	// line, the refusal's error (a *fence.StaleError when stale).
	Observer fence.WriteObserver
}

// Admit applies Admit's rules to lines for a call of class (a host, a
// gRPC service), logs a checker's failure and reports the admission.
func (r Receiver) Admit(ctx context.Context, class string, lines []string) (v Value, ok bool, refusal *Problem) {
	start := time.Now()
	v, ok, refusal, checkErr := Admit(ctx, lines, r.Require, r.Checker)
	if r.Observer != nil && (ok || refusal != nil) {
		seen, _ := Peek(lines)
		e := fence.WriteEvent{Ctx: ctx, Guard: r.Guard, Class: class, Op: "admit", Resource: seen.Resource, Token: seen.Token, Start: start}
		var err error
		if refusal != nil {
			err = refusal.Err()
		}
		fence.ObserveWrite(r.Observer, e, err)
	}
	if checkErr != nil {
		logger := r.Logger
		if logger == nil {
			logger = slog.Default()
		}
		logger.ErrorContext(ctx, r.Guard+": the fencing token could not be checked", "err", checkErr)
	}
	return v, ok, refusal
}
