package testutil

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestCluster_ElectsAndForwards(t *testing.T) {
	servers := Cluster(t, 3, nil)
	leader := WaitForLeader(t, servers...)
	fs := Followers(servers)
	must.Len(t, 2, fs)
	for _, f := range fs {
		must.NotEq(t, leader.ID(), f.ID())
	}
	var resp structs.NodeUpdateResponse
	err := fs[0].RPC("Node.Register", &structs.NodeRegisterRequest{Node: &structs.Node{
		ID: "5c5e3e2a-3b7c-4d57-9d3e-6f0f3b6f0b11", SecretID: "0f6d7c4e-2f8b-4f51-8a52-3c2e1c9f7a10",
		Name: "n1", Datacenter: "dc1", Status: structs.NodeStatusReady,
	}}, &resp)
	must.NoError(t, err)
	must.Positive(t, resp.Index)
}

func TestLogWriter_DropsAfterCleanup(t *testing.T) {
	var w *LogWriter
	t.Run("inner", func(t *testing.T) {
		w = NewLogWriter(t)
		n, err := w.Write([]byte("line\n"))
		must.NoError(t, err)
		must.Eq(t, 5, n)
	})
	// The inner test has ended: t.Log would panic, the writer drops.
	n, err := w.Write([]byte("late\n"))
	must.NoError(t, err)
	must.Eq(t, 5, n)
}
