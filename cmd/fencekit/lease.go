package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// fencekit lease ls|show|watch|revoke: the leases of a store, seen and
// changed only through the backend contract (driver.Lister,
// driver.Revoker, driver.Watcher).

const leaseUsage = `Usage:
  fencekit lease ls [PREFIX]          the leases whose names begin with PREFIX
                                      (all by default) that are held or have
                                      waiters: holder identity, owner, token,
                                      time left, waiters in line
  fencekit lease show NAME            one lease, held or not
  fencekit lease watch NAME           each change of NAME (a grant, an end, a
                                      new holder, a change of the line), read
                                      every --interval, until interrupted
  fencekit lease revoke NAME [--token N] [--owner OWNER]
                                      end NAME's current grant at the store:
                                      the next grant's token is greater, the
                                      revoked holder's renewals and acquires
                                      are refused (it learns at its next
                                      renewal at the latest), and a line of
                                      audit goes to the log and the output;
                                      --token and --owner refuse to revoke
                                      any grant but that one. Refused when
                                      nothing holds NAME.

Flags of every lease command:
  --store KIND        redis, postgres, postgres-session, etcd, zookeeper or
                      dynamodb (default: from the URL's scheme, or the one
                      FENCE_* variable that is set)
  --url ADDRESS       Redis URL ($FENCE_REDIS_URL), PostgreSQL URL
                      ($FENCE_POSTGRES_URL), etcd endpoints
                      ($FENCE_ETCD_ENDPOINTS) or ZooKeeper servers
                      ($FENCE_ZK_SERVERS), comma-separated host:port, or a
                      DynamoDB endpoint ($FENCE_DYNAMODB_ENDPOINT; default the
                      SDK's, credentials and region from the AWS configuration)
  --prefix P          the backend's key prefix: Redis (default fencekit:),
                      etcd (default fencekit/), DynamoDB (default none)
  --schema S          PostgreSQL: the schema of fencekit's lease tables
  --redis-mode M      standalone (default), sentinel (URL with master_name=)
                      or cluster (URL with addr= for more nodes)
  --root PATH         ZooKeeper: the root of the lease nodes
                      (default /fencekit/leases)
  --table T           DynamoDB: the lease table
  --key-attribute A   DynamoDB: the table's partition key (default name)
  -o table|json       a table for people (default), or JSON for scripts (ls
                      and show: one document; watch: one object a line)
  --timeout D         give up on each request after this long (default 30s)
  --interval D        watch: how often to read the lease (default 250ms); a
                      grant made and ended between two readings is not seen
`

func runLease(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "fencekit lease: missing subcommand (ls, show, watch, revoke)\n")
		return exitUsage
	}
	sub, args := args[0], args[1:]
	if isHelp(sub) {
		fmt.Fprint(stdout, leaseUsage)
		return exitOK
	}
	fs := flag.NewFlagSet("fencekit lease "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, leaseUsage) }
	var (
		s        storeFlags
		output   string
		interval time.Duration
		token    uint64
		owner    string
	)
	s.register(fs, getenv)
	fs.StringVar(&output, "o", "table", "table or json")
	switch sub {
	case "ls", "show":
	case "watch":
		fs.DurationVar(&interval, "interval", 250*time.Millisecond, "how often to read the lease")
	case "revoke":
		fs.Uint64Var(&token, "token", 0, "revoke only the grant with this token")
		fs.StringVar(&owner, "owner", "", "revoke only the grant of this owner")
	default:
		fmt.Fprintf(stderr, "fencekit lease: unknown subcommand %q (ls, show, watch, revoke)\n", sub)
		return exitUsage
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if isHelp(a) {
			fmt.Fprint(stdout, leaseUsage)
			return exitOK
		}
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return exitUsage
	}
	fs.Visit(func(f *flag.Flag) { s.prefixSet = s.prefixSet || f.Name == "prefix" })
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fencekit lease %s: %s\n", sub, fmt.Sprintf(format, a...))
		return exitUsage
	}
	switch {
	case output != "table" && output != "json":
		return usageErr("-o is table or json, not %q", output)
	case s.timeout <= 0:
		return usageErr("--timeout must be positive")
	case sub == "watch" && interval <= 0:
		return usageErr("--interval must be positive")
	case sub == "ls" && len(pos) > 1:
		return usageErr("takes at most one PREFIX, got %q", pos)
	case sub != "ls" && len(pos) != 1:
		return usageErr("takes one lease NAME, got %q", pos)
	}
	arg := ""
	if len(pos) == 1 {
		arg = pos[0]
	}
	if sub != "ls" {
		if err := driver.ValidateName(arg); err != nil {
			return usageErr("%v", err)
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	octx, cancel := context.WithTimeout(ctx, s.timeout)
	b, kind, closeStore, err := s.openStore(octx, log)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "fencekit lease %s: %v\n", sub, err)
		if closeStore == nil && kind == "" {
			return exitUsage
		}
		return exitFail
	}
	defer closeStore()
	out := &printer{w: stdout, json: output == "json"}
	switch sub {
	case "ls":
		err = leaseLs(ctx, b, s.timeout, arg, out)
	case "show":
		err = leaseShow(ctx, b, s.timeout, arg, out)
	case "watch":
		err = leaseWatch(ctx, b, s.timeout, arg, interval, out)
	case "revoke":
		err = leaseRevoke(ctx, b, kind, s.timeout, arg, owner, fence.Token(token), out, log)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fencekit lease %s: %v\n", sub, err)
		return exitFail
	}
	return exitOK
}

func isHelp(a string) bool { return a == "help" || a == "-h" || a == "-help" || a == "--help" }

// parseInterspersed parses flags that may come before or after the
// positional arguments (fencekit lease show NAME -o json) and returns the
// positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// leaseJSON is how a lease's status is written with -o json.
type leaseJSON struct {
	Name     string `json:"name"`
	Held     bool   `json:"held"`
	Identity string `json:"identity,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	// RemainingMS is the time left of the grant in milliseconds, as the
	// store counts it (0 when it cannot tell).
	RemainingMS int64 `json:"remaining_ms"`
	Waiters     int   `json:"waiters"`
}

func toJSON(st driver.Status) leaseJSON {
	j := leaseJSON{Name: st.Name, Held: st.Held(), Waiters: st.Waiters}
	if st.Held() {
		j.Identity, j.Owner, j.Token, j.RemainingMS = st.Holder.Identity(), st.Holder.Owner, uint64(st.Holder.Token), st.Holder.Remaining.Milliseconds()
	}
	return j
}

// printer writes statuses as a table or JSON.
type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) doc(v any) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (p *printer) line(v any) error { return json.NewEncoder(p.w).Encode(v) }

var tableHeader = []string{"NAME", "HOLDER", "OWNER", "TOKEN", "LEFT", "WAITERS"}

func row(st driver.Status) []string {
	if !st.Held() {
		return []string{st.Name, "-", "-", "-", "-", strconv.Itoa(st.Waiters)}
	}
	left := "?"
	if st.Holder.Remaining > 0 {
		left = st.Holder.Remaining.Round(time.Millisecond).String()
	}
	return []string{st.Name, st.Holder.Identity(), st.Holder.Owner, strconv.FormatUint(uint64(st.Holder.Token), 10), left, strconv.Itoa(st.Waiters)}
}

func (p *printer) table(sts []driver.Status) error {
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t"))
	for _, st := range sts {
		fmt.Fprintln(tw, strings.Join(row(st), "\t"))
	}
	return tw.Flush()
}

func leaseLs(ctx context.Context, b operator, timeout time.Duration, prefix string, p *printer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sts, err := b.List(ctx, prefix)
	if err != nil {
		return err
	}
	if p.json {
		out := make([]leaseJSON, 0, len(sts))
		for _, st := range sts {
			out = append(out, toJSON(st))
		}
		return p.doc(out)
	}
	return p.table(sts)
}

func leaseShow(ctx context.Context, b operator, timeout time.Duration, name string, p *printer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := b.Status(ctx, name)
	if err != nil {
		return err
	}
	if p.json {
		return p.doc(toJSON(st))
	}
	return p.table([]driver.Status{st})
}

// watchEvent is one change watch reports.
type watchEvent struct {
	At    time.Time `json:"at"`
	Event string    `json:"event"`
	leaseJSON
}

// change names what happened between two readings of a lease, or "" when
// nothing did that watch reports (the time left always moves).
func change(prev, cur driver.Status, first bool) string {
	switch {
	case first:
		return "now"
	case !prev.Held() && cur.Held():
		return "granted"
	case prev.Held() && !cur.Held():
		return "ended"
	case prev.Held() && (prev.Holder.Owner != cur.Holder.Owner || prev.Holder.Token != cur.Holder.Token):
		return "granted"
	case prev.Waiters != cur.Waiters:
		return "line"
	}
	return ""
}

// leaseWatch reads name at start and every interval, and prints each
// change, until ctx ends (an interrupt). It only reads (driver.Lister):
// it does not subscribe as a waiter would (driver.Watcher), which on some
// stores joins the line (a ZooKeeper ticket) and so changes what it
// watches. A grant made and ended between two readings is not seen; the
// token of the next grant shows that grants were missed.
func leaseWatch(ctx context.Context, b operator, timeout time.Duration, name string, interval time.Duration, p *printer) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var prev driver.Status
	for first := true; ; first = false {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		cur, err := b.Status(rctx, name)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if ev := change(prev, cur, first); ev != "" {
			if err := p.event(watchEvent{At: time.Now().UTC(), Event: ev, leaseJSON: toJSON(cur)}, cur); err != nil {
				return err
			}
		}
		prev = cur
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (p *printer) event(e watchEvent, st driver.Status) error {
	if p.json {
		return p.line(e)
	}
	what := "free"
	if st.Held() {
		left := "time left unknown"
		if st.Holder.Remaining > 0 {
			left = st.Holder.Remaining.Round(time.Millisecond).String() + " left"
		}
		what = fmt.Sprintf("held by %s (owner %s, token %d, %s)", st.Holder.Identity(), st.Holder.Owner, st.Holder.Token, left)
	}
	_, err := fmt.Fprintf(p.w, "%s  %-7s  %s: %s, %d waiting\n", e.At.Format("2006-01-02T15:04:05.000Z"), e.Event, st.Name, what, st.Waiters)
	return err
}

// errNothingHeld is the refusal of revoke when nothing holds the name.
var errNothingHeld = errors.New("nothing holds it: nothing to revoke")

// revokeJSON is revoke's output with -o json: the audit record.
type revokeJSON struct {
	Revoked  bool      `json:"revoked"`
	Name     string    `json:"name"`
	Store    string    `json:"store"`
	Identity string    `json:"identity"`
	Owner    string    `json:"owner"`
	Token    uint64    `json:"token"`
	By       string    `json:"by"`
	At       time.Time `json:"at"`
	// FenceToken is the token to push to the guarded resources (fencekit
	// fence advance) so that the revoked holder's writes are refused at
	// once: the revoked token + 1, which every later grant's token reaches.
	FenceToken uint64 `json:"fence_token"`
}

// leaseRevoke reads name's holder, checks it against the --owner and
// --token the operator named, revokes exactly that grant, and writes the
// audit line to the log and the output.
func leaseRevoke(ctx context.Context, b operator, kind string, timeout time.Duration, name, owner string, token fence.Token, p *printer, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := b.Status(ctx, name)
	if err != nil {
		return err
	}
	if !st.Held() {
		return fmt.Errorf("%q: %w", name, errNothingHeld)
	}
	h := st.Holder
	if owner != "" && h.Owner != owner {
		return fmt.Errorf("%q is held by %q (token %d), not by --owner %q: nothing revoked", name, h.Owner, h.Token, owner)
	}
	if token != fence.None && h.Token != token {
		return fmt.Errorf("%q is held with token %d (owner %q), not --token %d: nothing revoked", name, h.Token, h.Owner, token)
	}
	if err := b.Revoke(ctx, h); err != nil {
		if errors.Is(err, driver.ErrNotHeld) {
			return fmt.Errorf("%q changed hands while it was being revoked (%w): nothing revoked; look again with fencekit lease show", name, err)
		}
		return err
	}
	rec := revokeJSON{Revoked: true, Name: name, Store: kind, Identity: h.Identity(), Owner: h.Owner, Token: uint64(h.Token),
		By: who(), At: time.Now().UTC(), FenceToken: uint64(h.Token) + 1}
	log.Warn("lease revoked", "name", name, "store", kind, "owner", h.Owner, "identity", h.Identity(), "token", uint64(h.Token),
		"by", rec.By, "at", rec.At.Format(time.RFC3339Nano))
	if p.json {
		return p.doc(rec)
	}
	_, err = fmt.Fprintf(p.w, "revoked %q on %s: owner %s (identity %s), token %d, by %s at %s\n"+
		"the next grant's token will be greater than %d; to refuse the revoked holder's writes now: fencekit fence advance --token %d ...\n",
		name, kind, h.Owner, h.Identity(), h.Token, rec.By, rec.At.Format(time.RFC3339), h.Token, rec.FenceToken)
	return err
}

// who is the operator, for the audit line: the OS user and host,
// "user@host".
func who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}
