//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"time"

	"github.com/roamhq/roam/structs"
)

// Talking to servers as a client does: with a client's node identity, over
// msgpack RPC. The claim loop (make storm) and the linearizability
// workload of the chaos run call CSIVolume.Claim this way.

// nodeIdentity is a client's node ID and secret, as the client keeps them
// in its data dir. The loop authenticates as the node with them.
type nodeIdentity struct {
	NodeID   string
	SecretID string
}

// readNodeIdentity reads the identity of the client whose data dir is
// dataDir.
func readNodeIdentity(dataDir string) (*nodeIdentity, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "client", "identity.json"))
	if err != nil {
		return nil, err
	}
	var id nodeIdentity
	if err := json.Unmarshal(b, &id); err != nil {
		return nil, fmt.Errorf("node identity in %s: %w", dataDir, err)
	}
	if id.NodeID == "" || id.SecretID == "" {
		return nil, fmt.Errorf("node identity in %s is incomplete", dataDir)
	}
	return &id, nil
}

// dialRPC opens a msgpack RPC connection to a server, as a client does.
func dialRPC(addr string) (*rpc.Client, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte{structs.RPCNomad}); err != nil {
		conn.Close()
		return nil, err
	}
	return rpc.NewClientWithCodec(structs.NewClientCodec(conn)), nil
}
