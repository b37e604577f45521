// Package fencegrpc carries a fencing token over gRPC and checks it at the
// receiving service, with the semantics of package fencehttp: the token and
// its resource travel in the metadata entry "fencing-token"
// (fencewire.MetadataKey), in the syntax of the Fencing-Token HTTP field
// (docs/fencing-over-http.md).
//
// Client's interceptors (unary and streaming) send the value of the call's
// context (fencewire.NewContext) and turn a refusal back into an error: a
// stale token becomes a *fence.StaleError naming both tokens (the error
// also carries the gRPC status, for status.FromError); a call that carried
// a token and got no answer (DeadlineExceeded, Canceled, Unavailable)
// matches fence.ErrOutcomeUnknown.
//
// Server's interceptors (unary and streaming) refuse a malformed or
// repeated entry (and a missing one where a token is required) with
// codes.InvalidArgument, optionally check the token with a
// fencecheck.Checker before the handler runs (codes.FailedPrecondition
// when stale), and put the token into the handler's context
// (fence.FromContext, fencewire.FromContext), so that the handler's own
// guarded writes present it unchanged. A handler error holding a
// *fence.StaleError (a sqlguard or blobguard rejection) is sent as the
// same FailedPrecondition status.
//
// Every refusal's status has a google.rpc.ErrorInfo detail with domain
// "fencekit" and one of the reasons below; a stale one has metadata
// "resource", "presented" and "current" (decimal tokens).
//
// | refusal | code | reason |
// | --- | --- | --- |
// | stale token | FailedPrecondition | STALE_FENCING_TOKEN |
// | malformed or repeated entry | InvalidArgument | MALFORMED_FENCING_TOKEN |
// | no entry, token required | InvalidArgument | MISSING_FENCING_TOKEN |
// | the checker failed | Unavailable | FENCING_CHECK_UNAVAILABLE |
// | a token beyond what the checker can store | OutOfRange | FENCING_TOKEN_OUT_OF_RANGE |
//
// FailedPrecondition because gRPC's code guide gives it to an operation
// rejected for the system's state, which the client should not retry until
// that state changes: a stale holder must not retry at all.
//
// Client.Observer and Server.Observer report each call that carries a
// token (and each refusal) as a fence.WriteEvent, with the labels every
// guard's writes have (class: the call's service), for packages leaseprom
// and leaseotel.
//
// A fencing token is not a credential; see fencehttp's package doc and the
// specification's "Not authentication" section.
package fencegrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencewire"
)

// Domain is the ErrorInfo domain of fencekit's refusals.
const Domain = "fencekit"

// The ErrorInfo reasons of fencekit's refusals.
const (
	ReasonStale       = "STALE_FENCING_TOKEN"
	ReasonMalformed   = "MALFORMED_FENCING_TOKEN"
	ReasonMissing     = "MISSING_FENCING_TOKEN"
	ReasonUnavailable = "FENCING_CHECK_UNAVAILABLE"
	ReasonTokenRange  = "FENCING_TOKEN_OUT_OF_RANGE"
)

// ErrNoToken is returned by the client interceptors, before anything is
// sent, for a call whose context carries no fencing token when
// Client.Require is set.
var ErrNoToken = errors.New("fencegrpc: the call's context carries no fencing token")

// ErrTwoTokens is returned by the client interceptors, before anything is
// sent, when the outgoing metadata already has a fencing-token entry and
// the context carries a token too.
var ErrTwoTokens = errors.New("fencegrpc: the outgoing metadata has a fencing-token entry and the context carries a token")

// Error is the error a client interceptor returns for a refusal: Err is
// the fencekit error (a *fence.StaleError, or one matching
// fencewire.ErrRejected or fencewire.ErrUnavailable), Status the gRPC
// status it came in. errors.Is and errors.As see Err; status.FromError
// sees Status.
type Error struct {
	Status *status.Status
	Err    error
}

func (e *Error) Error() string              { return "fencegrpc: " + e.Err.Error() }
func (e *Error) Unwrap() error              { return e.Err }
func (e *Error) GRPCStatus() *status.Status { return e.Status }

// StatusOf returns the gRPC status fencekit sends for err: for a
// *fence.StaleError in err's chain, FailedPrecondition with its ErrorInfo;
// nil for any other error.
func StatusOf(err error) *status.Status {
	se, ok := fence.AsStale(err)
	if !ok {
		return nil
	}
	return problemStatus(fencewire.StaleProblem(se))
}

func refusal(c codes.Code, reason, msg string, md map[string]string) *status.Status {
	st := status.New(c, msg)
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: md}); err == nil {
		return withInfo
	}
	return st // an ErrorInfo always marshals; this is not reached
}

// ClientError returns the fencekit error for a status error err that
// carries one of fencekit's refusals (see the package doc) as an *Error,
// and err unchanged otherwise (nil for nil).
func ClientError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != Domain {
			continue
		}
		md := info.GetMetadata()
		p := fencewire.Problem{Detail: st.Message(), Resource: md["resource"], Presented: md["presented"], Current: md["current"]}
		switch info.GetReason() {
		case ReasonStale:
			p.Type = fencewire.ProblemStale
		case ReasonMalformed:
			p.Type = fencewire.ProblemMalformed
		case ReasonMissing:
			p.Type = fencewire.ProblemMissing
		case ReasonUnavailable:
			p.Type = fencewire.ProblemUnavailable
		case ReasonTokenRange:
			p.Type = fencewire.ProblemTokenRange
		default:
			continue
		}
		ferr := p.Err()
		return &Error{Status: st, Err: ferr}
	}
	return err
}

// Client makes the client interceptors. The zero value sends a token when
// the context has one and sends the call without one otherwise.
type Client struct {
	// Require refuses to send a call whose context carries no token.
	Require bool
	// Observer, when set, receives a fence.WriteEvent for every call that
	// carries a token (Guard "fencegrpc", Class the call's service, Op
	// "call", Resource and Token those it carries): for a unary call when
	// it returns, for a stream when it ends (RecvMsg returns io.EOF or an
	// error) or could not be made. Outcome "accepted" when the receiver
	// answered without a fencing refusal, "stale" for a stale refusal,
	// "unknown" when the call may have been carried out and its answer
	// was lost, "failed" otherwise.
	Observer fence.WriteObserver
}

// call is one call's fencing: whether it carries a token, and the event
// its observer gets.
type call struct {
	fenced bool
	event  fence.WriteEvent
}

// outgoing returns ctx with the context's value in the outgoing metadata,
// and the call's fencing (a token of its own or one already in the
// metadata).
func (c *Client) outgoing(ctx context.Context, method string) (context.Context, call, error) {
	v, ok := fencewire.FromContext(ctx)
	md, _ := metadata.FromOutgoingContext(ctx)
	lines := md.Get(fencewire.MetadataKey)
	has := len(lines) > 0
	if !ok {
		v, _ = fencewire.Peek(lines)
	}
	cl := call{fenced: ok || has}
	if cl.fenced && c.Observer != nil {
		cl.event = fence.WriteEvent{Ctx: ctx, Guard: "fencegrpc", Class: service(method), Op: "call", Resource: v.Resource, Token: v.Token, Start: time.Now()}
	}
	switch {
	case ok && has:
		return nil, cl, fmt.Errorf("fencegrpc: %s: %w", method, ErrTwoTokens)
	case !ok && !has && c.Require:
		return nil, cl, fmt.Errorf("fencegrpc: %s: %w", method, ErrNoToken)
	case !ok:
		return ctx, cl, nil
	}
	field, err := fencewire.Format(v)
	if err != nil {
		return nil, cl, fmt.Errorf("fencegrpc: %s: %w", method, err)
	}
	return metadata.AppendToOutgoingContext(ctx, fencewire.MetadataKey, field), cl, nil
}

// observe reports err, a fenced call's outcome, to the Client's observer.
func (c *Client) observe(cl call, err error) {
	if cl.fenced && c.Observer != nil {
		fence.ObserveWrite(c.Observer, cl.event, err)
	}
}

// service returns the service of a full method name, "/pkg.Service/Method".
func service(method string) string {
	s := strings.TrimPrefix(method, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i]
	}
	return s
}

// callErr is the error a client interceptor returns for a call's err:
// ClientError's, and for a call that carried a token and ended without an
// answer (DeadlineExceeded, Canceled, Unavailable), an *Error matching
// fence.ErrOutcomeUnknown: the call may have reached the handler, which
// may have written with the token.
func callErr(err error, fenced bool) error {
	ferr := ClientError(err)
	if ferr != err || !fenced {
		return ferr
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.DeadlineExceeded, codes.Canceled, codes.Unavailable:
		return &Error{Status: st, Err: fmt.Errorf("%w: %s: %s", fence.ErrOutcomeUnknown, st.Code(), st.Message())}
	}
	return err
}

// Unary returns the unary client interceptor: it sends the context's token,
// and returns ClientError of the call's error; for a call that carried a
// token and got no answer (DeadlineExceeded, Canceled, Unavailable), an
// *Error matching fence.ErrOutcomeUnknown, as a guard reports a write
// whose answer was lost (the call may have reached the handler). Errors
// before anything is sent: fencewire.ErrInvalid (and
// fence.ErrInvalidToken for token 0), ErrTwoTokens, ErrNoToken.
func (c *Client) Unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, cl, err := c.outgoing(ctx, method)
		if err == nil {
			err = callErr(invoker(ctx, method, req, reply, cc, opts...), cl.fenced)
		}
		c.observe(cl, err)
		return err
	}
}

// Stream returns the streaming client interceptor: it sends the context's
// token with the stream's headers, and maps the errors of the stream's
// creation and of its Header, SendMsg, RecvMsg and CloseSend as Unary does
// (a refusal before the handler runs arrives at the first RecvMsg; io.EOF
// passes unchanged).
func (c *Client) Stream() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, cl, err := c.outgoing(ctx, method)
		var cs grpc.ClientStream
		if err == nil {
			if cs, err = streamer(ctx, desc, cc, method, opts...); err != nil {
				err = callErr(err, cl.fenced)
			}
		}
		if err != nil {
			c.observe(cl, err)
			return nil, err
		}
		return &clientStream{ClientStream: cs, c: c, call: cl}, nil
	}
}

type clientStream struct {
	grpc.ClientStream
	c    *Client
	call call
	once sync.Once // the event, when the stream ends
}

func (s *clientStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	return md, callErr(err, s.call.fenced)
}
func (s *clientStream) SendMsg(m any) error { return callErr(s.ClientStream.SendMsg(m), s.call.fenced) }
func (s *clientStream) CloseSend() error    { return callErr(s.ClientStream.CloseSend(), s.call.fenced) }

// RecvMsg maps the error, and reports the stream's end (io.EOF: accepted)
// to the observer.
func (s *clientStream) RecvMsg(m any) error {
	err := callErr(s.ClientStream.RecvMsg(m), s.call.fenced)
	if err != nil {
		s.once.Do(func() {
			end := err
			if errors.Is(err, io.EOF) {
				end = nil
			}
			s.c.observe(s.call, end)
		})
	}
	return err
}

// Server makes the server interceptors; the rules are fencehttp.Handler's.
// A Server is safe for concurrent use once set up.
type Server struct {
	// Require refuses calls without a fencing token.
	Require bool
	// Checker, when set, checks each token before the handler runs (and
	// implies Require). A check orders checks, not the handler's effects
	// (see package fencecheck).
	Checker fencecheck.Checker
	// Logger logs the checker's failures. Nil: slog.Default().
	Logger *slog.Logger
	// Observer, when set, receives a fence.WriteEvent for every call that
	// carries a fencing-token entry or is refused for lacking one (Guard
	// "fencegrpc", Class the call's service, Op "admit", Resource and
	// Token those of a well-formed entry), once it is admitted or
	// refused, before the handler runs: Outcome "accepted" when admitted,
	// "stale" for a stale token, "failed" for any other refusal. The
	// handler's own guarded writes report through their guards'
	// observers.
	Observer fence.WriteObserver
}

// admit reads and checks the call's entry and returns the handler's
// context, or the refusal's status error.
func (s *Server) admit(ctx context.Context, method string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	rcv := fencewire.Receiver{Guard: "fencegrpc", Require: s.Require, Checker: s.Checker, Logger: s.Logger, Observer: s.Observer}
	v, ok, p := rcv.Admit(ctx, service(method), md.Get(fencewire.MetadataKey))
	switch {
	case p != nil:
		return nil, problemStatus(*p).Err()
	case ok:
		return fencewire.NewContext(ctx, v), nil
	}
	return ctx, nil
}

// problemStatus is the gRPC form of a refusal.
func problemStatus(p fencewire.Problem) *status.Status {
	switch p.Type {
	case fencewire.ProblemStale:
		return refusal(codes.FailedPrecondition, ReasonStale, p.Detail,
			map[string]string{"resource": p.Resource, "presented": p.Presented, "current": p.Current})
	case fencewire.ProblemMissing:
		return refusal(codes.InvalidArgument, ReasonMissing, "this method requires a "+fencewire.MetadataKey+" metadata entry", nil)
	case fencewire.ProblemUnavailable:
		return refusal(codes.Unavailable, ReasonUnavailable, p.Detail, nil)
	case fencewire.ProblemTokenRange:
		return refusal(codes.OutOfRange, ReasonTokenRange, p.Detail,
			map[string]string{"resource": p.Resource, "presented": p.Presented})
	}
	return refusal(codes.InvalidArgument, ReasonMalformed, p.Detail, nil)
}

// handlerErr sends a handler's stale rejection as fencekit's status.
func handlerErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err // the handler chose its status
	}
	if st := StatusOf(err); st != nil {
		return st.Err()
	}
	return err
}

// Unary returns the unary server interceptor.
func (s *Server) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := s.admit(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		resp, err := handler(ctx, req)
		return resp, handlerErr(err)
	}
}

// Stream returns the streaming server interceptor: the stream's Context
// carries the token.
func (s *Server) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := s.admit(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handlerErr(handler(srv, serverStream{ss, ctx}))
	}
}

type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s serverStream) Context() context.Context { return s.ctx }
