package testutil

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// Server is what the cluster helpers need of a server (a *nomad.Server):
// its Raft ID, whether it leads, and whom it takes for leader.
type Server interface {
	ID() string
	IsLeader() bool
	Leader() (addr, id string)
}

// Stopper is anything a test starts and must stop: a server, an agent.
type Stopper interface {
	Shutdown(ctx context.Context) error
}

// Start calls start and shuts what it returns down when the test ends,
// ignoring the error: a test that cares how its server stops stops it
// itself (a server's Shutdown is safe to call twice). The caller builds
// the server from its config, so that this package needs no import of
// the server and the server's own in-package tests can use it.
func Start[S Stopper](t testing.TB, start func() (S, error)) S {
	t.Helper()
	s, err := start()
	must.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// StartCluster starts n servers with start(i) and returns them without
// waiting for a leader; see WaitForLeader.
func StartCluster[S Stopper](t testing.TB, n int, start func(i int) (S, error)) []S {
	t.Helper()
	servers := make([]S, n)
	for i := range servers {
		servers[i] = Start(t, func() (S, error) { return start(i) })
	}
	return servers
}

// TCPListeners opens n listeners on loopback ports chosen by the kernel,
// for a TCP cluster whose servers must know each other's address before
// any of them starts. Each listener is handed to a server, which closes
// it; those a failed test never handed over are closed at its end.
func TCPListeners(t testing.TB, n int) ([]net.Listener, []string) {
	t.Helper()
	listeners := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range listeners {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		must.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		listeners[i] = ln
		addrs[i] = ln.Addr().String()
	}
	return listeners, addrs
}

// WaitForLeader waits until exactly one of servers leads and every one of
// them agrees on it, and returns the leader. It gives up after 30 s: a
// loaded machine running -race can take seconds to elect with the LAN
// timers agents use.
func WaitForLeader[S Server](t testing.TB, servers ...S) S {
	t.Helper()
	var leader S
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			var err error
			leader, err = AgreedLeader(servers)
			return err
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(10*time.Millisecond),
	))
	return leader
}

// AgreedLeader returns the one server of servers that leads, or an error
// that says why there is none: no server leads, two do, or one of them
// takes another for leader. Wait on it with other conditions, as
// WaitForLeader does alone.
func AgreedLeader[S Server](servers []S) (S, error) {
	var leader S
	found := false
	for _, s := range servers {
		if s.IsLeader() {
			if found {
				return leader, fmt.Errorf("two leaders: %s and %s", leader.ID(), s.ID())
			}
			leader, found = s, true
		}
	}
	if !found {
		return leader, fmt.Errorf("no leader among %d servers", len(servers))
	}
	for _, s := range servers {
		if _, id := s.Leader(); id != leader.ID() {
			return leader, fmt.Errorf("server %s sees leader %q, want %s", s.ID(), id, leader.ID())
		}
	}
	return leader, nil
}

// Followers returns the servers that do not lead now.
func Followers[S Server](servers []S) []S {
	var out []S
	for _, s := range servers {
		if !s.IsLeader() {
			out = append(out, s)
		}
	}
	return out
}
