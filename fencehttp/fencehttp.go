// Package fencehttp carries a fencing token over HTTP, in the Fencing-Token
// header field of package fencewire (docs/fencing-over-http.md), and checks
// it at the receiving service.
//
// On the client, Transport (an http.RoundTripper) sends the token and
// resource that the request's context carries (fencewire.NewContext), and
// turns a receiver's refusal back into an error: a stale token becomes a
// *fence.StaleError naming both tokens, so that a stale holder's HTTP call
// fails exactly like its stale SQL write; a request whose answer was lost
// is reported as fence.ErrOutcomeUnknown, as a guard reports a write whose
// answer was lost. Bound calls with Transport.Timeout or the request's
// context, not http.Client.Timeout, whose own timer makes net/http replace
// the error (the Transport refuses a call with a token through such a
// client: ErrClientTimeout). A call whose context ends while its answer is
// on its way waits Transport.Grace for it, so that a refusal that crossed
// a lost lease is reported as the refusal it is.
//
// On the server, Handler reads the field, refuses a malformed or repeated
// one (and a missing one where a token is required) with 400 and a problem
// document, optionally checks the token with a fencecheck.Checker before
// the handler runs (409 when stale, 422 for a token the checker cannot
// store), and puts the token into the request's
// context (fence.FromContext, fencewire.FromContext), so that the handler's
// own guarded writes (sqlguard, blobguard) present it unchanged. WriteError
// answers a handler's own stale write the same way.
//
// Transport.Observer and Handler.Observer report each call that carries a
// token (and each refusal) as a fence.WriteEvent, with the labels every
// guard's writes have, for packages leaseprom and leaseotel.
//
// A fencing token orders writers; it does not say who may write. Anyone who
// can reach the service can send any token, including one far in the future
// that locks every holder out. Authenticate callers (mTLS, signed tokens,
// a gateway) and restrict which resources each may name; see the
// specification's "Not authentication" section.
package fencehttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencewire"
)

// ErrNoToken is returned by Transport, before anything is sent, for a
// request whose context carries no fencing token when Require is set.
var ErrNoToken = errors.New("fencehttp: the request's context carries no fencing token")

// ErrTwoTokens is returned by Transport, before anything is sent, when a
// request already has a Fencing-Token field and its context carries a token
// too: which one the caller meant is unknowable.
var ErrTwoTokens = errors.New("fencehttp: the request has a Fencing-Token field and its context carries a token")

// maxProblem bounds how much of a refusal's body Transport reads.
const maxProblem = 64 << 10

// Transport is an http.RoundTripper that sends the fencing token of each
// request's context (fencewire.FromContext) in the Fencing-Token field, and
// turns the receiver's fencing problems back into errors. It does not
// change the caller's request (it sends a copy with the field added). A
// Transport is safe for concurrent use; the zero value sends through
// http.DefaultTransport.
//
// RoundTrip returns, before any I/O and with the request's body closed: an
// error matching fencewire.ErrInvalid (and fence.ErrInvalidToken for token
// 0) when the context's value cannot be sent; ErrTwoTokens; ErrNoToken when
// Require is set and the context has no token; ErrClientTimeout for a
// request that carries a token through an http.Client whose Timeout is set;
// for a request that carries a token, the context's error (joined with its
// cause) when the context has already ended: nothing was sent.
//
// For a request that carried a token, Base's error is joined with
// fence.ErrOutcomeUnknown unless the connection could not be made: the
// request may have reached the service, whose handler may have written
// with the token (a lost reply, a timeout), so it is reported like a
// guard's write whose answer was lost, never as a plain failure; Base's
// error stays in the chain (context.DeadlineExceeded, context.Canceled and
// the context's cause match). Without a token, Base's error is returned as
// it is.
//
// A request that carried a token is not cut short the moment its context
// ends: the Transport waits Grace longer for an answer already on its way,
// so that a refusal or a success that crossed the end of the context (a
// lease lost while the call was in flight) is reported as what it is, and
// only a call still unanswered then is an unknown outcome. RoundTrip may
// therefore return up to Grace after the context ended.
//
// When the answer is a fencing problem (an application/problem+json body
// of one of fencewire's Problem types), it closes the body and returns no
// response and the problem's error: a *fence.StaleError (matching
// fence.ErrStaleToken) naming the resource, the presented and the current
// token; an error matching fencewire.ErrRejected for a malformed or
// missing field (and fencecheck.ErrTokenRange as well for a token beyond
// what the receiver can store); one matching fencewire.ErrUnavailable when
// the receiver could not check. http.Client wraps these in a *url.Error,
// through which errors.Is and errors.As still find them. (The
// http.RoundTripper contract asks a transport not to interpret responses;
// this one does so for fencewire's problem types only, which is its
// purpose. Set KeepProblems to get the responses, and read them with
// ResponseError.)
//
// # Timeouts
//
// Bound calls with Timeout (or the request's context), not with
// http.Client.Timeout: when the client's own timer fires, net/http
// replaces the transport's error with a string of its own, so a call that
// may have been carried out would reach the caller as a plain failure,
// whichever of the client's timer and the transport's answer came first.
// The Transport refuses a request with a token that comes through such a
// client (ErrClientTimeout: http.Client marks it by setting the request's
// Cancel channel, which this Transport therefore refuses on a request with
// a token, whoever set it).
type Transport struct {
	// Base sends the requests. Nil: http.DefaultTransport.
	Base http.RoundTripper
	// Require refuses to send a request whose context carries no token.
	Require bool
	// KeepProblems returns fencing problems as responses, not errors.
	KeepProblems bool
	// Timeout bounds each request, from the start of RoundTrip until its
	// response's body is read to its end or closed (the span of
	// http.Client.Timeout). A request with a token that times out is an
	// unknown outcome; its error matches fence.ErrOutcomeUnknown and
	// context.DeadlineExceeded. Zero: no bound but the request's context.
	Timeout time.Duration
	// Grace is how long a request with a token still waits for its
	// answer, and for its response's body, after its context ended. Zero:
	// DefaultGrace; negative: none (the context's end stops the call at
	// once, and an answer that was on its way is lost).
	Grace time.Duration
	// Observer, when set, receives a fence.WriteEvent for every request
	// that carries a token (Guard "fencehttp", Class the host it goes to,
	// Op "call", Resource and Token those it carries), once RoundTrip
	// returns: Outcome "accepted" when the receiver answered without a
	// fencing problem, "stale" for a stale refusal, "unknown" when the
	// call may have been carried out and its answer was lost, "failed"
	// otherwise (a refusal of the field, a call not sent). With
	// KeepProblems, a problem response is classified as its error would
	// be.
	Observer fence.WriteObserver
}

// DefaultGrace is Transport.Grace when it is zero: long enough for an
// answer already on its way across a data centre, short enough that a
// cancelled call returns soon after its context ended.
const DefaultGrace = 250 * time.Millisecond

// ErrClientTimeout is returned by Transport, before anything is sent, for
// a request with a token whose Request.Cancel channel is set, as
// http.Client sets it when its Timeout is set: when that timer fires, the
// client replaces the Transport's error with a string of its own, and a
// call that may have been carried out would be reported as a plain
// failure. Leave http.Client.Timeout zero and set Transport.Timeout. (With
// a Client.Timeout shorter than it takes to return the refusal, the client
// replaces the refusal too; its string still carries this one's text.)
var ErrClientTimeout = errors.New("fencehttp: http.Client.Timeout would report a timed-out call as a plain failure, not as an unknown outcome: leave it zero and set fencehttp.Transport.Timeout instead")

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Observer == nil {
		return t.roundTrip(req)
	}
	v, fenced := fencewire.FromContext(req.Context())
	if !fenced && hasField(req.Header) {
		v, _ = fencewire.Peek(fieldLines(req.Header))
		fenced = true
	}
	if !fenced {
		return t.roundTrip(req)
	}
	host := req.URL.Host
	if host == "" {
		host = req.Host
	}
	e := fence.WriteEvent{Ctx: req.Context(), Guard: "fencehttp", Class: host, Op: "call", Resource: v.Resource, Token: v.Token, Start: time.Now()}
	resp, err := t.roundTrip(req)
	observed := err
	if err == nil && t.KeepProblems {
		observed = ResponseError(resp)
	}
	fence.ObserveWrite(t.Observer, e, observed)
	return resp, err
}

func (t *Transport) roundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	v, ok := fencewire.FromContext(req.Context())
	has := hasField(req.Header)
	fenced := ok || has
	var err error
	switch {
	case ok && has:
		err = ErrTwoTokens
	case !ok && !has && t.Require:
		err = ErrNoToken
	//lint:ignore SA1019 http.Client marks a request it times out by setting this deprecated field: reading it is how the Transport tells.
	case fenced && req.Cancel != nil:
		err = ErrClientTimeout
	case fenced && req.Context().Err() != nil:
		err = fmt.Errorf("not sent: %w", ctxErr(req.Context()))
	}
	out := req
	if err == nil && ok {
		var field string
		if field, err = fencewire.Format(v); err == nil {
			out = new(http.Request)
			*out = *req
			out.Header = req.Header.Clone()
			if out.Header == nil {
				out.Header = make(http.Header)
			}
			out.Header[fencewire.HeaderName] = []string{field}
		}
	}
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("fencehttp: %s %s: %w", req.Method, req.URL.Redacted(), err)
	}
	resp, err := t.send(base, out, fenced)
	if err != nil && fenced && !notSent(err) {
		return resp, fmt.Errorf("fencehttp: %s %s: %w: %w", req.Method, req.URL.Redacted(), fence.ErrOutcomeUnknown, err)
	}
	if err != nil || t.KeepProblems {
		return resp, err
	}
	if perr := ResponseError(resp); perr != nil {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("fencehttp: %s %s: %w", req.Method, req.URL.Redacted(), perr)
	}
	return resp, nil
}

// send sends req through base. A request with a token, or any request
// when Timeout is set, runs under an exchange of its own: a context that
// ends when the exchange is over (no response, or the response's body read
// to its end or closed), at Timeout, or Grace after the caller's context
// ended (a request with a token; without one, with the caller's context).
func (t *Transport) send(base http.RoundTripper, req *http.Request, fenced bool) (*http.Response, error) {
	if !fenced && t.Timeout <= 0 {
		return base.RoundTrip(req)
	}
	caller := req.Context()
	parent := caller
	if fenced {
		parent = context.WithoutCancel(caller)
	}
	ctx, cancel := context.WithCancelCause(parent)
	x := &exchange{cancel: cancel}
	if t.Timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, t.Timeout,
			fmt.Errorf("fencehttp: Transport.Timeout (%v) exceeded: %w", t.Timeout, context.DeadlineExceeded))
		x.cancel = func(cause error) { cancel(cause); stop() }
	}
	if fenced {
		grace := t.Grace
		if grace == 0 {
			grace = DefaultGrace
		}
		x.stopWatch = context.AfterFunc(caller, func() { x.callerEnded(ctxErr(caller), grace) })
	}
	resp, err := base.RoundTrip(req.WithContext(ctx))
	if err != nil || resp == nil || resp.Body == nil {
		x.end()
		return resp, err
	}
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &exchangeConn{exchangeBody{ReadCloser: rw, x: x}, rw}
	} else {
		resp.Body = &exchangeBody{ReadCloser: resp.Body, x: x}
	}
	return resp, nil
}

// exchange is the life of one request sent by send: its context's cancel,
// and the watch of the caller's context.
type exchange struct {
	cancel    context.CancelCauseFunc
	stopWatch func() bool

	mu    sync.Mutex
	ended bool
	grace *time.Timer
}

// errExchangeOver is the cause of an exchange's context once the exchange
// is over; nothing reads it.
var errExchangeOver = errors.New("fencehttp: the exchange is over")

// callerEnded runs when the caller's context ends: the exchange ends grace
// later (at once when grace is negative), unless it is over first.
func (x *exchange) callerEnded(cause error, grace time.Duration) {
	if grace < 0 {
		x.cancel(cause)
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.ended {
		x.grace = time.AfterFunc(grace, func() { x.cancel(cause) })
	}
}

// end ends the exchange: its context is cancelled, the watch and the
// grace timer are stopped. Safe to call more than once.
func (x *exchange) end() {
	if x.stopWatch != nil {
		x.stopWatch()
	}
	x.mu.Lock()
	x.ended = true
	if x.grace != nil {
		x.grace.Stop()
	}
	x.mu.Unlock()
	x.cancel(errExchangeOver)
}

// exchangeBody is a response's body that ends its exchange when it is
// read to its end (or fails) or closed.
type exchangeBody struct {
	io.ReadCloser
	x *exchange
}

func (b *exchangeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.x.end()
	}
	return n, err
}

func (b *exchangeBody) Close() error {
	err := b.ReadCloser.Close()
	b.x.end()
	return err
}

// exchangeConn is the body of a 101 Switching Protocols response, which
// the caller also writes to.
type exchangeConn struct {
	exchangeBody
	w io.Writer
}

func (c *exchangeConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// ctxErr returns ctx's error, joined with its cause when that differs (a
// lease's context ends with the lease's loss as its cause).
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}

// hasField reports whether h has a Fencing-Token field under any spelling
// of its name: a key set directly in the map, not through Header.Set, is
// sent as it is, and the receiver reads it as the same field.
func hasField(h http.Header) bool {
	if _, ok := h[fencewire.HeaderName]; ok {
		return true
	}
	for k := range h {
		if strings.EqualFold(k, fencewire.HeaderName) {
			return true
		}
	}
	return false
}

// fieldLines returns the lines of h's Fencing-Token field, under any
// spelling of its name.
func fieldLines(h http.Header) []string {
	var lines []string
	for k, vs := range h {
		if strings.EqualFold(k, fencewire.HeaderName) {
			lines = append(lines, vs...)
		}
	}
	return lines
}

// notSent reports whether err says that the request never left: the
// connection could not be made.
func notSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// ResponseError returns the error for a response that carries one of
// fencewire's problems (see Transport), and nil for any other response. It
// reads the body of a problem+json response with a 400, 409, 422 or 503 status
// (at most 64 KiB) and puts back what it read, so the caller can still
// read the body.
func ResponseError(resp *http.Response) error {
	if resp == nil || resp.Body == nil {
		return nil
	}
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity, http.StatusServiceUnavailable:
	default:
		return nil
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != fencewire.ProblemContentType {
		return nil
	}
	// A body that cannot be read or decoded is not a fencing problem: the
	// caller gets the response, and what could be read is put back.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblem))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
	var p fencewire.Problem
	if json.Unmarshal(body, &p) != nil {
		return nil
	}
	return p.Err()
}

// Handler is the server side: an http.Handler that reads a request's
// Fencing-Token field before Next runs.
//
//   - No field: the request goes to Next unchanged, unless Require is set
//     or Checker is not nil; then it is refused with 400 and
//     fencewire.ProblemMissing.
//   - A malformed field, or more than one field line: 400 and
//     fencewire.ProblemMalformed, whatever Require says. A field is never
//     ignored.
//   - A valid field, with Checker set: the token is checked first. Stale:
//     409 and fencewire.ProblemStale naming both tokens; Next does not run.
//     A valid token the checker cannot store (fencecheck.ErrTokenRange):
//     422 and fencewire.ProblemTokenRange. The checker fails: 503 and
//     fencewire.ProblemUnavailable (the cause is logged, not sent).
//   - Then Next runs with the value in the request's context:
//     fencewire.FromContext gives the resource and token,
//     fence.FromContext the token.
//
// Every refusal has an application/problem+json body (fencewire.Problem).
// A Handler is safe for concurrent use once set up.
type Handler struct {
	// Next handles the requests that pass. A nil Next answers 500.
	Next http.Handler
	// Require refuses requests without a fencing token.
	Require bool
	// Checker, when set, checks each token before Next runs (and implies
	// Require). See package fencecheck for what a check orders: the
	// checks, not Next's effects.
	Checker fencecheck.Checker
	// Logger logs the checker's failures. Nil: slog.Default().
	Logger *slog.Logger
	// Observer, when set, receives a fence.WriteEvent for every request
	// that carries a Fencing-Token field or is refused for lacking one
	// (Guard "fencehttp", Class the request's host, Op "admit", Resource
	// and Token those of a well-formed field), once it is admitted or
	// refused, before Next runs: Outcome "accepted" when admitted,
	// "stale" for a stale token, "failed" for any other refusal. The
	// event times the admission (the Checker's check); Next's own
	// guarded writes report through their guards' observers.
	Observer fence.WriteObserver
}

var _ http.Handler = (*Handler)(nil)

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.Next == nil {
		http.Error(w, "fencehttp: Handler.Next is nil", http.StatusInternalServerError)
		return
	}
	rcv := fencewire.Receiver{Guard: "fencehttp", Require: h.Require, Checker: h.Checker, Logger: h.Logger, Observer: h.Observer}
	v, ok, refusal := rcv.Admit(r.Context(), r.Host, r.Header.Values(fencewire.HeaderName))
	switch {
	case refusal != nil:
		WriteProblem(w, *refusal)
	case ok:
		h.Next.ServeHTTP(w, r.WithContext(fencewire.NewContext(r.Context(), v)))
	default:
		h.Next.ServeHTTP(w, r)
	}
}

// WriteProblem writes p as an application/problem+json response with
// p.Status (500 if it is 0).
func WriteProblem(w http.ResponseWriter, p fencewire.Problem) {
	if p.Status == 0 {
		p.Status = http.StatusInternalServerError
	}
	body, err := json.Marshal(p)
	if err != nil { // a Problem holds only strings and an int
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", fencewire.ProblemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// WriteError answers err for a handler whose own guarded write was
// rejected: when err holds a *fence.StaleError (a sqlguard or blobguard
// rejection, or a checker's), it writes 409 with fencewire.ProblemStale and
// returns true, and the client's Transport returns the same
// *fence.StaleError; otherwise it writes nothing and returns false.
func WriteError(w http.ResponseWriter, err error) bool {
	se, ok := fence.AsStale(err)
	if !ok {
		return false
	}
	WriteProblem(w, fencewire.StaleProblem(se))
	return true
}
