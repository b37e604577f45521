package faultnet

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
)

// ReplyLoser is an http.RoundTripper that loses the replies of the
// requests Lose picks: it sends such a request through Next, reads the
// whole reply (the service has handled the request by then) and returns
// no response and an error as a connection reset after the request went
// out would (a *net.OpError of a read, matching ErrReplyLost and
// syscall.ECONNRESET). Other requests pass.
type ReplyLoser struct {
	// Next sends the requests. Nil: http.DefaultTransport.
	Next http.RoundTripper
	// Lose reports whether the reply to req is to be lost; it is asked
	// once per request. Nil: every reply while armed (see Arm), the next
	// one only.
	Lose func(req *http.Request) bool

	armed atomic.Bool
	lost  atomic.Int64
}

// Arm makes a ReplyLoser without Lose lose the next reply.
func (l *ReplyLoser) Arm() { l.armed.Store(true) }

// Lost returns how many replies were lost so far.
func (l *ReplyLoser) Lost() int64 { return l.lost.Load() }

// RoundTrip implements http.RoundTripper.
func (l *ReplyLoser) RoundTrip(req *http.Request) (*http.Response, error) {
	next := l.Next
	if next == nil {
		next = http.DefaultTransport
	}
	lose := l.armed.Swap(false)
	if l.Lose != nil {
		lose = l.Lose(req)
	}
	if !lose {
		return next.RoundTrip(req)
	}
	if err := LoseReply(next, req); err != nil {
		return nil, err
	}
	l.lost.Add(1)
	return nil, &net.OpError{Op: "read", Net: "tcp", Err: lostReset{}}
}

// LoseReply sends req through next and reads its whole reply, which it
// throws away: the service has handled the request when it returns nil.
// An error is next's (the request may not have been handled).
func LoseReply(next http.RoundTripper, req *http.Request) error {
	resp, err := next.RoundTrip(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return err
}

// lostReset is the error under a lost reply's *net.OpError.
type lostReset struct{}

func (lostReset) Error() string { return "connection reset by peer: " + ErrReplyLost.Error() }

func (lostReset) Is(target error) bool { return target == ErrReplyLost || target == syscall.ECONNRESET }
