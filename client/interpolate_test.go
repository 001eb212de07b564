package client

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/client/taskenv"
	"github.com/roamhq/roam/structs"
)

// A task's args and env are interpolated when it starts: its ports and
// allocation, the node's ID, attributes and meta; an unknown reference is
// left as written.
func TestAllocRunner_InterpolatesConfigAndEnv(t *testing.T) {
	dataDir := t.TempDir()
	srv := newFakeServer(uuid.NewString())
	node := &structs.Node{ID: srv.nodeID, Name: "web-1", Datacenter: "dc1",
		Attributes: map[string]string{"kernel.name": "linux"}, Meta: map[string]string{"rack": "r7"}}
	startTestManagerWith(t, srv, dataDir, nil, func(c *allocManagerConfig) {
		c.NodeVars = func() map[string]string { return taskenv.NodeVars(node) }
	})
	task := shTask("t", `echo "$1|$2|$3|$4|$ADDR|$UNKNOWN" > "$NOMAD_ALLOC_DIR/interp"`)
	task.Config["args"] = []any{"-c", `echo "$1|$2|$3|$4|$ADDR|$UNKNOWN" > "$NOMAD_ALLOC_DIR/interp"`, "sh",
		"${NOMAD_PORT_http}", "${node.unique.name}", "${attr.kernel.name}", "${meta.rack}"}
	task.Env = map[string]string{"ADDR": "${NOMAD_ADDR_http}", "UNKNOWN": "${nope.nothing}"}
	alloc := testAlloc(srv.nodeID, structs.JobTypeBatch, noRestarts, task)
	alloc.AllocatedResources = &structs.AllocatedResources{Shared: structs.AllocatedSharedResources{
		Ports: []structs.AllocatedPortMapping{{Label: "http", Value: 20007, HostIP: "127.0.0.1"}}}}
	srv.upsert(alloc)
	waitStatus(t, srv, alloc.ID, structs.AllocClientStatusComplete)
	got := strings.TrimSpace(waitFile(t, filepath.Join(dataDir, "alloc", alloc.ID, "alloc", "interp")))
	must.Eq(t, "20007|web-1|linux|r7|127.0.0.1:20007|${nope.nothing}", got)
}
