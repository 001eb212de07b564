package nomad

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// staleGetNode reads a node from s's own copy of the state.
func staleGetNode(s *Server, id string) (*structs.Node, error) {
	var reply structs.SingleNodeResponse
	err := s.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: id,
		QueryOptions: structs.QueryOptions{Region: s.config.Region, AllowStale: true}}, &reply)
	return reply.Node, err
}

// restartServer starts a server again on old's data dir and address.
func restartServer(t *testing.T, cfg *Config) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", cfg.Listener.Addr().String())
	must.NoError(t, err)
	return testServer(t, func(c *Config) {
		*c = *cfg
		c.Listener = ln
	})
}

// TestStaleRead_RestartedServerDoesNotGoBack: a server started again
// holds its Raft log on disk but applies none of it until a leader says
// how much is committed. Until it has caught up once, its own copy of the
// state is older than the one it had reached before it stopped, and a
// stale read from it would say that a node it had long known is not
// there. It answers stale reads as default ones until then: from the
// leader, or with no leader after the hold timeout.
func TestStaleRead_RestartedServerDoesNotGoBack(t *testing.T) {
	t.Parallel()
	servers := testClusterWith(t, 3, func(c *Config) { c.RPCHoldTimeout = 500 * time.Millisecond })
	leader := waitForLeader(t, servers...)
	n := testNode("known-before-the-restart")
	registerNode(t, leader, n)
	cfgs := make([]*Config, len(servers))
	for i, s := range servers {
		must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
			got, err := staleGetNode(s, n.ID)
			if err != nil || got == nil {
				return fmt.Errorf("server %d has not applied the node yet (%v)", i, err)
			}
			return nil
		}), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
		cfgs[i] = s.Config()
	}
	for _, s := range servers {
		must.NoError(t, s.Shutdown(context.Background()))
	}

	// Alone, the server finds no leader: its log is on disk, unapplied.
	alone := restartServer(t, cfgs[0])
	got, err := staleGetNode(alone, n.ID)
	must.ErrorIs(t, err, structs.ErrNoLeader, must.Sprintf("a stale read answered %v from the state before the log", got))

	// With the others back it catches up, and answers from its own copy.
	restartServer(t, cfgs[1])
	restartServer(t, cfgs[2])
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		got, err := staleGetNode(alone, n.ID)
		if err != nil || got == nil {
			return fmt.Errorf("no node from the restarted server yet (%v)", err)
		}
		return nil
	}), wait.Timeout(20*time.Second), wait.Gap(50*time.Millisecond)))

}

func TestCommandIndex_LastCommandThrough(t *testing.T) {
	c := &commandIndex{LogStore: raft.NewInmemStore()}
	must.NoError(t, c.StoreLogs([]*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogNoop},
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte{1}},
		{Index: 3, Term: 1, Type: raft.LogNoop},
		{Index: 4, Term: 2, Type: raft.LogCommand, Data: []byte{1}},
	}))
	for _, tc := range []struct{ through, want uint64 }{{1, 0}, {2, 2}, {3, 2}, {4, 4}, {9, 4}} {
		got, ok := c.lastCommandThrough(tc.through)
		must.True(t, ok)
		must.Eq(t, tc.want, got, must.Sprintf("through %d", tc.through))
	}
	// Below what it lists, it cannot tell: it lists every command above
	// 8 only.
	partial := &commandIndex{LogStore: raft.NewInmemStore(), refs: []commandRef{{index: 10, term: 3}}, known: 8}
	_, ok := partial.lastCommandThrough(9)
	must.False(t, ok)
	got, ok := partial.lastCommandThrough(10)
	must.True(t, ok)
	must.Eq(t, uint64(10), got)
}
