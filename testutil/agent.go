package testutil

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

// RPCer makes an RPC the way an agent or a server does in process.
type RPCer interface {
	RPC(method string, args, reply any) error
}

// StartAgent starts an agent with start, which gets the writer for the
// agent's log (a LogWriter: each line to t.Log), and shuts it down when
// the test ends. A shutdown that fails or takes over 30 s fails the test.
// The caller builds the agent from its config, so that this package need
// not import the agent and the agent's own tests can use it.
func StartAgent[A Stopper](t testing.TB, start func(logs io.Writer) (A, error)) A {
	t.Helper()
	a, err := start(NewLogWriter(t))
	must.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		must.NoError(t, a.Shutdown(ctx))
	})
	return a
}

// WaitForNodeReady waits until the node with nodeID reads as ready
// through rpc: the read goes to the leader, so it also waits for one.
func WaitForNodeReady(t testing.TB, rpc RPCer, nodeID string) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(
		wait.ErrorFunc(func() error {
			var reply structs.SingleNodeResponse
			if err := rpc.RPC("Node.GetNode", &structs.NodeSpecificRequest{NodeID: nodeID}, &reply); err != nil {
				return err
			}
			if reply.Node == nil || reply.Node.Status != structs.NodeStatusReady {
				return fmt.Errorf("node %s not ready yet", nodeID)
			}
			return nil
		}),
		wait.Timeout(30*time.Second),
		wait.Gap(20*time.Millisecond),
	))
}
