package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/uuid"
	"github.com/roamhq/roam/internal/fsutil"
)

// identity is what makes a node the same node across restarts.
type identity struct {
	NodeID   string
	SecretID string
}

// loadIdentity reads the node's identity from dataDir, creating and
// persisting a new one on first start.
func loadIdentity(dataDir string) (*identity, error) {
	dir := filepath.Join(dataDir, "client")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("client: create data dir: %w", err)
	}
	path := filepath.Join(dir, "identity.json")
	buf, err := os.ReadFile(path)
	switch {
	case err == nil:
		var id identity
		if err := json.Unmarshal(buf, &id); err != nil {
			return nil, fmt.Errorf("client: %s is corrupt: %w", path, err)
		}
		if _, err := uuid.Parse(id.NodeID); err != nil {
			return nil, fmt.Errorf("client: %s: bad node ID %q: %w", path, id.NodeID, err)
		}
		if id.SecretID == "" {
			return nil, fmt.Errorf("client: %s: missing secret ID", path)
		}
		return &id, nil
	case errors.Is(err, os.ErrNotExist):
		id := &identity{NodeID: uuid.NewString(), SecretID: uuid.NewString()}
		buf, _ := json.Marshal(id)
		if err := fsutil.WriteFileAtomic(path, buf, 0o600); err != nil {
			return nil, fmt.Errorf("client: persist identity: %w", err)
		}
		return id, nil
	default:
		return nil, fmt.Errorf("client: read identity: %w", err)
	}
}
