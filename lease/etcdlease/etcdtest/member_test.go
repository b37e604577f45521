package etcdtest

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// Each member is a process of its own: the leader killed, another is
// elected; the killed member starts again over its data with its raft ID;
// a whole cluster stopped and started again keeps what was written.
func TestMembersKilledStoppedStarted(t *testing.T) {
	c := StartWith(t, 3, Steady)
	cli := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	lead := c.Leader()
	m := c.Members[lead]
	id := m.MemberID()
	if id == 0 {
		t.Fatal("the leader reports no raft ID")
	}
	m.Kill()
	if m.Running() || m.MemberID() != 0 {
		t.Fatalf("killed member: Running %v, MemberID %x", m.Running(), m.MemberID())
	}
	if next := c.WaitLeader(); next == lead {
		t.Fatalf("m%d still leads after it was killed", lead)
	}
	m.Start()
	if got := m.MemberID(); got != id {
		t.Fatalf("restarted member's raft ID %x, was %x", got, id)
	}
	c.StopAll()
	for _, m := range c.Members {
		if m.Running() {
			t.Fatalf("%s still running after StopAll", m.Name)
		}
	}
	c.StartAll()
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after the restart k is %v, want v", resp.Kvs)
	}
}

// The member program ends when its input does (the test process is gone),
// without being told to stop.
func TestMemberProgramEndsWithItsInput(t *testing.T) {
	peer, client := freeURL(t), freeURL(t)
	p, _, err := startProc([]string{
		"-name", "m0",
		"-dir", filepath.Join(t.TempDir(), "m0"),
		"-peer-url", peer.String(),
		"-client-url", client.String(),
		"-initial-cluster", "m0=" + peer.String(),
		"-token", "input-ends",
	}, startTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
		t.Fatal("the member program still runs 30 s after its input ended")
	}
}
