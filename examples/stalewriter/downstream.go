package main

// The downstream mode (--downstream): besides the row and the object, the
// workers send their report to an HTTP service of the demo's own, as a
// leased job calls an internal API. The token travels in the Fencing-Token
// header (package fencehttp); the service keeps the newest token per
// resource (fencecheck.Memory) and changes its state only under it
// (Memory.Do), so A's late call is rejected by the service itself, with
// the same *fence.StaleError a stale SQL write gets. With --unguarded the
// workers send no token and the service checks nothing.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/lease"
)

// downstreamVar hands the service's URL to the worker processes.
const downstreamVar = "FENCEKIT_STALEWRITER_DOWNSTREAM"

const downstreamUsage = "also send each worker's report to an HTTP service of the demo's own on loopback, with the\nfencing token in the Fencing-Token header; the service rejects A's late call"

// downstream is the demo's downstream service, run in the orchestrator's
// process on a loopback port. A nil *downstream (the mode is off) does
// nothing.
type downstream struct {
	url       string
	srv       *http.Server
	unguarded bool
	checker   *fencecheck.Memory

	mu        sync.Mutex
	writtenBy string
	token     fence.Token
}

// startDownstream starts the service when --downstream is set, and returns
// nil otherwise.
func startDownstream(o options, out io.Writer) (*downstream, error) {
	if !o.downstream {
		// A value inherited from the environment must not make the
		// workers call a service this run did not start.
		return nil, os.Unsetenv(downstreamVar)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("downstream service: %w", err)
	}
	d := &downstream{url: "http://" + lis.Addr().String() + "/reports", unguarded: o.unguarded, checker: fencecheck.NewMemory()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reports", d.post)
	var h http.Handler = mux
	if !o.unguarded {
		h = &fencehttp.Handler{Require: true, Next: mux}
	}
	d.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.srv.Serve(lis) }()
	if err := os.Setenv(downstreamVar, d.url); err != nil { // the workers inherit it
		_ = d.srv.Close()
		return nil, err
	}
	check := "checks the Fencing-Token header and keeps the newest token per resource"
	if o.unguarded {
		check = "checks nothing (--unguarded)"
	}
	fmt.Fprintf(out, "Downstream service: %s, an HTTP service of this demo's own that %s.\n", d.url, check)
	return d, nil
}

// post stores a report; with a token, only under the resource's newest
// token (the change runs inside Memory.Do, so checks and changes are
// ordered alike).
func (d *downstream) post(w http.ResponseWriter, r *http.Request) {
	var rep objectBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&rep); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	store := func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.writtenBy, d.token = rep.WrittenBy, rep.Token
		return nil
	}
	var err error
	if v, ok := fencewire.FromContext(r.Context()); ok {
		err = d.checker.Do(r.Context(), v.Resource, v.Token, store)
	} else {
		err = store()
	}
	if err != nil && !fencehttp.WriteError(w, err) {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (d *downstream) close() {
	if d == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = d.srv.Shutdown(ctx)
	_ = os.Unsetenv(downstreamVar)
}

// writeDownstream is a worker's call to the service, when the orchestrator
// started one: the report, with the lease's token unless unguarded.
func (w *worker) writeDownstream(ctx context.Context, l *lease.Lease, note string) {
	url := os.Getenv(downstreamVar)
	if url == "" {
		return
	}
	cfg := w.cfg
	tok, sent, deadline := l.Token(), time.Now(), l.Deadline()
	body, _ := json.Marshal(objectBody{WrittenBy: cfg.Role, Token: tok, Note: note})
	client := &http.Client{Transport: &fencehttp.Transport{Require: !cfg.Unguarded}}
	if !cfg.Unguarded {
		ctx = fencewire.NewContext(ctx, fencewire.Value{Resource: cfg.Resource, Token: tok})
	}
	err := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
		}
		return nil
	}()
	w.reportWrite(event{Store: storeService, Token: tok, Sent: sent, Deadline: deadline}, err, "report via "+url)
}

// storeService is the Store of the workers' calls to the service.
const storeService = "service"

// finish judges the calls to the service the way the verdict judges the
// stores' writes, prints the service's state and that judgement, and folds
// it into sum (an unsafe service makes the run unsafe).
func (d *downstream) finish(sum *summary, out io.Writer) {
	if d == nil {
		return
	}
	d.mu.Lock()
	by, tok := d.writtenBy, d.token
	d.mu.Unlock()
	writes := writesTo(sum.Events, storeService, grantsOf(sum.Events))
	var lines, problems, failures []string
	var newest *writeView
	for i := range writes {
		w := &writes[i]
		if w.Outcome == outcomeAccepted && (newest == nil || w.Token > newest.Token) {
			newest = w
		}
		switch {
		case w.Outcome == outcomeAccepted && acceptedBefore(writes, w) != nil:
			before := acceptedBefore(writes, w)
			problems = append(problems, fmt.Sprintf("the service ACCEPTED %s's call with stale token %d after %s's with token %d: %s's report is lost.",
				w.Role, w.Token, before.Role, before.Token, before.Role))
		case w.Outcome == outcomeAccepted && !w.lostAt.IsZero():
			lines = append(lines, fmt.Sprintf("the service accepted %s's call (token %d) %s: no newer call had reached it yet.", w.Role, w.Token, lostPhrase(w)))
		case w.Outcome == outcomeStale:
			if v := acceptedWith(writes, w.Current, w.Token); v != nil {
				lines = append(lines, fmt.Sprintf("the service REJECTED %s's call (token %d) %s: %s's call had reached it first.", w.Role, w.Token, lostPhrase(w), v.Role))
			} else {
				problems = append(problems, fmt.Sprintf("the service rejected %s's call (token %d) as stale, but accepted no newer one.", w.Role, w.Token))
			}
		case w.Outcome == outcomeFailed:
			failures = append(failures, fmt.Sprintf("%s's call (token %d) FAILED: %s", w.Role, w.Token, firstLine(w.Error, 120)))
		}
	}
	if newest != nil && (by != newest.Role || tok != newest.Token) && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("the service holds %s's report (token %d), not that of the newest accepted token %d (%s).",
			orNone(by), tok, newest.Token, newest.Role))
	}
	head := "DOWNSTREAM: SAFE."
	switch {
	case len(problems) > 0:
		head = "DOWNSTREAM: UNSAFE."
		sum.OK, sum.Inconclusive = false, false
	case len(failures) > 0:
		head = "DOWNSTREAM: NOT SHOWN: a call failed for another reason than a stale token."
		if sum.OK || sum.Inconclusive {
			sum.OK, sum.Inconclusive = false, true
		}
	}
	text := strings.Join(append([]string{head}, indent(append(append(problems, failures...), lines...))...), "\n")
	fmt.Fprintf(out, "Downstream service: holds the report of %s, token %d.\n%s\n", orNone(by), tok, text)
	sum.Verdict += "\n" + text
}
