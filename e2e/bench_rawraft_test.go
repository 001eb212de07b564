//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// The raw engine's own handover, measured next to Roam's in
// BenchmarkLeadership_LeaderlessGap: three hashicorp/raft nodes in this
// process, each with a raft-wal log and a file snapshot store on the same
// disk as the cluster, talking TCP over loopback, with Raft's default
// (production) timers, as Roam's servers run. Each handoff is timed from
// LeadershipTransfer on the leader to the first write the new leader
// commits; the new leader writes as soon as Raft tells it it leads, as
// Roam's establishLeadership does with its barrier.

// rawNode is one in-process Raft node.
type rawNode struct {
	id    raft.ServerID
	r     *raft.Raft
	trans *raft.NetworkTransport
	wal   *raftwal.WAL
	// acquired delivers, each time this node becomes leader, when its
	// first write committed (or the error that write got). All nodes share
	// one channel.
	acquired chan rawAcquired
	// stop ends watch, which closes done.
	stop, done chan struct{}
}

type rawAcquired struct {
	at time.Time
	// lastContact is when the new leader last heard from the old one, as
	// Raft reports it on becoming leader: the start of Roam's own
	// leaderless gap, measured the same way here.
	lastContact time.Time
	err         error
}

// rawFSM applies nothing: the measurement is the engine's.
type rawFSM struct{}

func (rawFSM) Apply(*raft.Log) any                   { return nil }
func (rawFSM) Snapshot() (raft.FSMSnapshot, error)   { return rawSnap{}, nil }
func (rawFSM) Restore(rc io.ReadCloser) error        { return rc.Close() }
func (rawSnap) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (rawSnap) Release()                             {}

type rawSnap struct{}

// startRawCluster starts three nodes under dir and waits for a leader.
func startRawCluster(tb testing.TB, dir string) []*rawNode {
	tb.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Name: "raw-raft", Level: hclog.Off, Output: io.Discard})
	var nodes []*rawNode
	var cfg raft.Configuration
	acquired := make(chan rawAcquired, 16)
	stop := make(chan struct{})
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("raw raft: listen: %v", err)
		}
		addr := ln.Addr().(*net.TCPAddr)
		ln.Close()
		trans, err := raft.NewTCPTransportWithLogger(addr.String(), addr, 3, 10*time.Second, logger)
		if err != nil {
			tb.Fatalf("raw raft: transport: %v", err)
		}
		n := &rawNode{id: raft.ServerID(fmt.Sprintf("raw-%d", i)), trans: trans,
			acquired: acquired, stop: stop, done: make(chan struct{})}
		nodes = append(nodes, n)
		cfg.Servers = append(cfg.Servers, raft.Server{Suffrage: raft.Voter, ID: n.id, Address: trans.LocalAddr()})
	}
	for i, n := range nodes {
		d := filepath.Join(dir, fmt.Sprintf("raw-%d", i))
		if err := os.MkdirAll(filepath.Join(d, "wal"), 0o700); err != nil {
			tb.Fatalf("raw raft: %v", err)
		}
		wal, err := raftwal.Open(filepath.Join(d, "wal"))
		if err != nil {
			tb.Fatalf("raw raft: open wal: %v", err)
		}
		n.wal = wal
		snaps, err := raft.NewFileSnapshotStoreWithLogger(d, 2, logger)
		if err != nil {
			tb.Fatalf("raw raft: snapshot store: %v", err)
		}
		rc := raft.DefaultConfig()
		rc.LocalID = n.id
		rc.Logger = logger
		notify := make(chan bool, 10)
		rc.NotifyCh = notify
		r, err := raft.NewRaft(rc, rawFSM{}, wal, wal, snaps, n.trans)
		if err != nil {
			tb.Fatalf("raw raft: start: %v", err)
		}
		n.r = r
		if err := r.BootstrapCluster(cfg).Error(); err != nil {
			tb.Fatalf("raw raft: bootstrap: %v", err)
		}
		go n.watch(notify)
	}
	tb.Cleanup(func() {
		close(stop)
		for _, n := range nodes {
			<-n.done
			if err := n.r.Shutdown().Error(); err != nil {
				tb.Logf("raw raft: shutdown %s: %v", n.id, err)
			}
			n.trans.Close()
			n.wal.Close()
		}
	})
	// The first leader's write, which the handoffs do not count.
	select {
	case a := <-acquired:
		if a.err != nil {
			tb.Fatalf("raw raft: first write: %v", a.err)
		}
	case <-time.After(leaderTimeout):
		tb.Fatalf("raw raft: no leader after %s", leaderTimeout)
	}
	return nodes
}

// watch writes once each time this node becomes leader and reports when
// that write committed.
func (n *rawNode) watch(notify <-chan bool) {
	defer close(n.done)
	for {
		select {
		case isLeader := <-notify:
			if !isLeader {
				continue
			}
			lastContact := n.r.LastContact()
			err := n.r.Apply([]byte("first write"), 10*time.Second).Error()
			select {
			case n.acquired <- rawAcquired{at: time.Now(), lastContact: lastContact, err: err}:
			default: // nobody measures this term
			}
		case <-n.stop:
			return
		}
	}
}

// rawLeader returns the node that leads, or nil.
func rawLeader(nodes []*rawNode) *rawNode {
	for _, n := range nodes {
		if n.r.State() == raft.Leader {
			return n
		}
	}
	return nil
}

// rawHandoff is one measured raw handover.
type rawHandoff struct {
	// transfer is from LeadershipTransfer to the new leader's first
	// committed write; gap from the new leader's last contact with the
	// old one to that write (Roam's leaderless gap, measured alike).
	transfer, gap time.Duration
}

// measureRawHandoffs makes count leadership transfers on nodes and
// measures each one to the new leader's first committed write. Between two, it waits until every node has applied the
// new leader's write, so each transfer starts from a settled cluster.
func measureRawHandoffs(tb testing.TB, nodes []*rawNode, count int) []rawHandoff {
	tb.Helper()
	var out []rawHandoff
	for i := range count {
		old := rawLeader(nodes)
		if old == nil {
			tb.Fatalf("raw raft: no leader before handoff %d", i+1)
		}
		// Drop what a previous term left unread, so the next value is
		// this handoff's.
		for len(old.acquired) > 0 {
			<-old.acquired
		}
		start := time.Now()
		if err := old.r.LeadershipTransfer().Error(); err != nil {
			tb.Fatalf("raw raft: handoff %d: transfer: %v", i+1, err)
		}
		select {
		case a := <-old.acquired:
			if a.err != nil {
				tb.Fatalf("raw raft: handoff %d: first write: %v", i+1, a.err)
			}
			h := rawHandoff{transfer: a.at.Sub(start), gap: -1}
			if !a.lastContact.IsZero() {
				h.gap = a.at.Sub(a.lastContact)
			}
			out = append(out, h)
		case <-time.After(leaderTimeout):
			tb.Fatalf("raw raft: handoff %d: no write by a new leader after %s", i+1, leaderTimeout)
		}
		if err := pollEvery(settle, 2*time.Millisecond, func() error {
			l := rawLeader(nodes)
			if l == nil || l == old {
				return errors.New("no new leader")
			}
			want := l.r.AppliedIndex()
			for _, n := range nodes {
				if n.r.AppliedIndex() < want {
					return fmt.Errorf("%s behind", n.id)
				}
			}
			return nil
		}); err != nil {
			tb.Fatalf("raw raft: after handoff %d: %v", i+1, err)
		}
	}
	return out
}
