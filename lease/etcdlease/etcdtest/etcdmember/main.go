// Command etcdmember runs one etcd member (go.etcd.io/etcd/server/v3/embed,
// the version this module requires) for package etcdtest, which builds it
// with go build, without the race detector, and runs each member
// of its clusters as a process of its own: a race-enabled test binary then
// instruments its own code, not etcd's server.
//
// It starts the member with the flags' settings and etcdtest's fixed ones
// (no fsync, the cheapest bcrypt cost, no logs), and talks to its parent
// over its standard input and output, one line each way:
//
//	ready ID          (written once the member serves; ID its raft ID, hex)
//	status            (read)  -> status LEAD ID: the leader it knows (0: none), its own ID
//	stop              (read)  the way etcd shuts down (embed's Close), then exit 0
//
// End of input (the parent is gone) exits at once. A member that cannot
// start writes why to standard error and exits 1.
//
// It is fencekit's own test equipment, not part of the library.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func main() {
	var (
		name        = flag.String("name", "", "the member's name")
		dir         = flag.String("dir", "", "the member's data directory")
		peer        = flag.String("peer-url", "", "the URL to listen on for peers, and advertise")
		client      = flag.String("client-url", "", "the URL to listen on for clients, and advertise")
		initial     = flag.String("initial-cluster", "", "name=peer-url,... of every member")
		token       = flag.String("token", "", "the initial cluster token")
		tickMs      = flag.Uint("tick-ms", 10, "heartbeat interval, milliseconds")
		electionMs  = flag.Uint("election-ms", 100, "election timeout, milliseconds")
		readyWithin = flag.Duration("ready-within", 30*time.Second, "how long the member may take to be ready")
	)
	flag.Parse()
	e, err := start(*name, *dir, *peer, *client, *initial, *token, *tickMs, *electionMs, *readyWithin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdmember %s: %v\n", *name, err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	reply := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	reply("ready %x", uint64(e.Server.MemberID()))

	lines := make(chan string)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			lines <- in.Text()
		}
		close(lines)
	}()
	for {
		select {
		case err := <-e.Err():
			fmt.Fprintf(os.Stderr, "etcdmember %s: %v\n", *name, err)
			os.Exit(1)
		case line, ok := <-lines:
			switch {
			case !ok:
				os.Exit(2) // the parent is gone
			case line == "status":
				reply("status %x %x", e.Server.Lead(), uint64(e.Server.MemberID()))
			case line == "stop":
				e.Close()
				os.Exit(0)
			default:
				fmt.Fprintf(os.Stderr, "etcdmember %s: unknown command %q\n", *name, line)
			}
		}
	}
}

// start starts the member and waits until it is ready.
func start(name, dir, peer, client, initial, token string, tickMs, electionMs uint, readyWithin time.Duration) (*embed.Etcd, error) {
	peerURL, err := url.Parse(peer)
	if err != nil {
		return nil, fmt.Errorf("-peer-url: %w", err)
	}
	clientURL, err := url.Parse(client)
	if err != nil {
		return nil, fmt.Errorf("-client-url: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.InitialCluster = initial
	cfg.InitialClusterToken = token
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored when the data directory exists
	cfg.TickMs = tickMs
	cfg.ElectionMs = electionMs
	cfg.UnsafeNoFsync = true
	// The cheapest password hashing bcrypt allows (4; etcd's default is
	// 10): tests that enable authentication check what the backend makes
	// of a refusal, not the hash, and each Authenticate at cost 10 takes
	// seconds on a loaded 2-core machine, past the attempt's bound.
	cfg.BcryptCost = 4
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	var e *embed.Etcd
	// A port freed by a member that just stopped, or taken meanwhile by
	// another process, may refuse the bind for a moment: try a few times.
	for attempt := 0; ; attempt++ {
		e, err = embed.StartEtcd(cfg)
		if err == nil || attempt == 50 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("failed while starting: %w", err)
	case <-time.After(readyWithin):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("not ready within %v", readyWithin)
	}
}
