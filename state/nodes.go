package state

import (
	"fmt"
	"iter"
	"sort"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/structs"
)

// UpsertNode registers or re-registers a node at index. A re-registration
// keeps the node's CreateIndex, its scheduling eligibility and its drain.
func (s *StateStore) UpsertNode(index uint64, node *structs.Node, evals ...*structs.Evaluation) error {
	txn := s.writeTxn()
	defer txn.Abort()

	n := node.Copy()
	existing, err := txn.First(TableNodes, "id", n.ID)
	if err != nil {
		return fmt.Errorf("state: node lookup: %w", err)
	}
	if existing != nil {
		old := existing.(*structs.Node)
		n.CreateIndex = old.CreateIndex
		n.SchedulingEligibility = old.SchedulingEligibility
		// Drains are the servers' to start and end: a client that
		// re-registers (its fingerprint changed, as a plugin stopping
		// during the drain changes it) knows nothing of one.
		n.DrainStrategy, n.Drain, n.LastDrain = old.DrainStrategy, old.Drain, old.LastDrain
	} else {
		n.CreateIndex = index
		if n.SchedulingEligibility == "" {
			n.SchedulingEligibility = structs.NodeSchedulingEligible
		}
	}
	if n.Status == "" {
		n.Status = structs.NodeStatusInit
	}
	n.ModifyIndex = index
	if err := txn.Insert(TableNodes, n); err != nil {
		return fmt.Errorf("state: node insert: %w", err)
	}
	if err := setIndexTxn(txn, TableNodes, index); err != nil {
		return err
	}
	if err := updatePluginsForNodeTxn(txn, index, n.ID, n); err != nil {
		return err
	}
	if err := upsertEvalsTxn(txn, index, evals); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// UpdateNodeStatus sets a node's status at index, with the evaluations
// the change triggers (nil for none).
func (s *StateStore) UpdateNodeStatus(index uint64, nodeID, status string, updatedAt int64, evals ...*structs.Evaluation) error {
	return s.updateNode(index, nodeID, evals, func(n *structs.Node) {
		n.Status = status
		n.StatusUpdatedAt = updatedAt
	})
}

// DeleteNodes removes nodes at index. Unknown IDs are an error and nothing
// is removed.
func (s *StateStore) DeleteNodes(index uint64, nodeIDs []string) error {
	txn := s.writeTxn()
	defer txn.Abort()

	for _, id := range nodeIDs {
		existing, err := txn.First(TableNodes, "id", id)
		if err != nil {
			return fmt.Errorf("state: node lookup: %w", err)
		}
		if existing == nil {
			return fmt.Errorf("%w: %s", structs.ErrUnknownNode, id)
		}
		if err := txn.Delete(TableNodes, existing); err != nil {
			return fmt.Errorf("state: node delete: %w", err)
		}
		if err := updatePluginsForNodeTxn(txn, index, id, nil); err != nil {
			return err
		}
	}
	if err := setIndexTxn(txn, TableNodes, index); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// NodeByID returns the node or nil. ws, if not nil, is told when it changes.
func (s *StateStore) NodeByID(ws memdb.WatchSet, id string) (*structs.Node, error) {
	txn := s.db.Txn(false)
	watchCh, raw, err := txn.FirstWatch(TableNodes, "id", id)
	if err != nil {
		return nil, fmt.Errorf("state: node lookup: %w", err)
	}
	ws.Add(watchCh)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.Node), nil
}

// NodeBySecretID returns the node holding secret, or nil.
func (s *StateStore) NodeBySecretID(ws memdb.WatchSet, secret string) (*structs.Node, error) {
	txn := s.db.Txn(false)
	watchCh, raw, err := txn.FirstWatch(TableNodes, "secret_id", secret)
	if err != nil {
		return nil, fmt.Errorf("state: node lookup: %w", err)
	}
	ws.Add(watchCh)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.Node), nil
}

// NodesByIDPrefix returns the nodes whose ID starts with prefix, sorted by ID.
func (s *StateStore) NodesByIDPrefix(ws memdb.WatchSet, prefix string) ([]*structs.Node, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(TableNodes, "id_prefix", prefix)
	if err != nil {
		return nil, fmt.Errorf("state: node scan: %w", err)
	}
	ws.Add(iter.WatchCh())
	return collectNodes(iter), nil
}

// NodesByCSIController returns the nodes that run a controller instance of
// pluginID (healthy or not, any status), sorted by ID.
func (s *StateStore) NodesByCSIController(ws memdb.WatchSet, pluginID string) ([]*structs.Node, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(TableNodes, "csi_controller", pluginID)
	if err != nil {
		return nil, fmt.Errorf("state: node scan by csi controller: %w", err)
	}
	ws.Add(iter.WatchCh())
	return collectNodes(iter), nil
}

// CSIControllerCandidates returns the nodes that may serve a controller
// call for pluginID, in the order to try them: ready nodes whose
// controller instance of the plugin is healthy, sorted by node ID, lowest
// first. The sequence reads the state as it was when this was called, and
// lazily: taking only the first node costs one index lookup however many
// nodes run the plugin.
func (s *StateStore) CSIControllerCandidates(pluginID string) (iter.Seq[*structs.Node], error) {
	txn := s.db.Txn(false)
	it, err := txn.Get(TableNodes, "csi_controller_ready", pluginID)
	if err != nil {
		return nil, fmt.Errorf("state: controller candidates of plugin %q: %w", pluginID, err)
	}
	first := it
	return func(yield func(*structs.Node) bool) {
		// A memdb iterator runs once: a second range reads the same
		// snapshot (txn) again.
		cur := first
		first = nil
		if cur == nil {
			if cur, err = txn.Get(TableNodes, "csi_controller_ready", pluginID); err != nil {
				return
			}
		}
		for raw := cur.Next(); raw != nil; raw = cur.Next() {
			if !yield(raw.(*structs.Node)) {
				return
			}
		}
	}, nil
}

// Nodes returns every node, sorted by ID.
func (s *StateStore) Nodes(ws memdb.WatchSet) ([]*structs.Node, error) {
	return s.NodesByIDPrefix(ws, "")
}

// DrainingNodes returns the nodes with a drain strategy, by ID, without
// reading the others; ws fires when a node starts or stops draining or a
// draining node changes.
func (s *StateStore) DrainingNodes(ws memdb.WatchSet) ([]*structs.Node, error) {
	txn := s.db.Txn(false)
	iter, err := txn.Get(TableNodes, "draining", true)
	if err != nil {
		return nil, fmt.Errorf("state: draining nodes: %w", err)
	}
	ws.Add(iter.WatchCh())
	return collectNodes(iter), nil
}

func collectNodes(iter memdb.ResultIterator) []*structs.Node {
	var out []*structs.Node
	for raw := iter.Next(); raw != nil; raw = iter.Next() {
		out = append(out, raw.(*structs.Node))
	}
	// memdb's radix order is already by ID; keep the promise explicit.
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
