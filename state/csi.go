package state

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// updatePluginsForNodeTxn folds a node's CSI fingerprint into the plugins
// table: the node's instances replace what the table had for it. A nil
// node removes the node's instances (deregistration). Plugins left with no
// instance are deleted.
func updatePluginsForNodeTxn(txn *memdb.Txn, index uint64, nodeID string, node *structs.Node) error {
	touched := make(map[string]bool)
	iter, err := txn.Get(TableCSIPlugins, "id")
	if err != nil {
		return fmt.Errorf("state: plugin scan: %w", err)
	}
	for raw := iter.Next(); raw != nil; raw = iter.Next() {
		p := raw.(*structs.CSIPlugin)
		if p.Controllers[nodeID] != nil || p.Nodes[nodeID] != nil {
			touched[p.ID] = true
		}
	}
	if node != nil {
		for id := range node.CSIControllerPlugins {
			touched[id] = true
		}
		for id := range node.CSINodePlugins {
			touched[id] = true
		}
	}
	ids := make([]string, 0, len(touched))
	for id := range touched {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		var p *structs.CSIPlugin
		raw, err := txn.First(TableCSIPlugins, "id", id)
		if err != nil {
			return fmt.Errorf("state: plugin lookup: %w", err)
		}
		if raw != nil {
			p = copyPlugin(raw.(*structs.CSIPlugin))
		} else {
			p = &structs.CSIPlugin{ID: id, CreateIndex: index,
				Controllers: map[string]*structs.CSIInfo{}, Nodes: map[string]*structs.CSIInfo{}}
		}
		delete(p.Controllers, nodeID)
		delete(p.Nodes, nodeID)
		if node != nil {
			if info := node.CSIControllerPlugins[id]; info != nil {
				c := *info
				p.Controllers[nodeID] = &c
			}
			if info := node.CSINodePlugins[id]; info != nil {
				c := *info
				p.Nodes[nodeID] = &c
			}
		}
		if len(p.Controllers) == 0 && len(p.Nodes) == 0 {
			if raw != nil {
				if err := txn.Delete(TableCSIPlugins, raw); err != nil {
					return fmt.Errorf("state: plugin delete: %w", err)
				}
			}
			continue
		}
		summarizePlugin(p)
		p.ModifyIndex = index
		if err := txn.Insert(TableCSIPlugins, p); err != nil {
			return fmt.Errorf("state: plugin insert: %w", err)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	return setIndexTxn(txn, TableCSIPlugins, index)
}

// summarizePlugin derives counts and identity from the plugin's instances.
func summarizePlugin(p *structs.CSIPlugin) {
	p.ControllersExpected, p.ControllersHealthy = len(p.Controllers), 0
	p.NodesExpected, p.NodesHealthy = len(p.Nodes), 0
	p.ControllerRequired = false
	p.ControllerConcurrency, p.ControllerConcurrencyWarning = controllerConcurrency(p.Controllers)
	for _, info := range p.Controllers {
		if info.Healthy {
			p.ControllersHealthy++
		}
		p.ControllerRequired = p.ControllerRequired || info.RequiresControllerPlugin
		p.Provider, p.Version = info.Provider, info.ProviderVersion
	}
	for _, info := range p.Nodes {
		if info.Healthy {
			p.NodesHealthy++
		}
		p.ControllerRequired = p.ControllerRequired || info.RequiresControllerPlugin
		if p.Provider == "" {
			p.Provider, p.Version = info.Provider, info.ProviderVersion
		}
	}
}

// controllerConcurrency is the smallest controller_concurrency among the
// healthy controllers (a client that predates it reports 0, which is 1),
// and, when they disagree, a warning that says so; 1 when none is healthy.
func controllerConcurrency(controllers map[string]*structs.CSIInfo) (int, string) {
	least, most := 0, 0
	var leastNode, mostNode string
	for nodeID, info := range controllers {
		if !info.Healthy {
			continue
		}
		// A client's report is bounded as its config is.
		n := min(max(1, info.ControllerConcurrency), laneadmit.MaxLimit)
		// Node IDs break ties, so the warning does not change with map order.
		if least == 0 || n < least || (n == least && nodeID < leastNode) {
			least, leastNode = n, nodeID
		}
		if n > most || (n == most && nodeID < mostNode) {
			most, mostNode = n, nodeID
		}
	}
	if least == 0 {
		return 1, ""
	}
	if least == most {
		return least, ""
	}
	return least, fmt.Sprintf("controllers disagree on controller_concurrency: %d on node %s, %d on node %s; using %d",
		least, leastNode, most, mostNode, least)
}

func copyPlugin(p *structs.CSIPlugin) *structs.CSIPlugin {
	c := *p
	c.Controllers = make(map[string]*structs.CSIInfo, len(p.Controllers))
	for k, v := range p.Controllers {
		c.Controllers[k] = v
	}
	c.Nodes = make(map[string]*structs.CSIInfo, len(p.Nodes))
	for k, v := range p.Nodes {
		c.Nodes[k] = v
	}
	return &c
}

// CSIPluginByID returns the plugin or nil.
func (s *StateStore) CSIPluginByID(ws memdb.WatchSet, id string) (*structs.CSIPlugin, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableCSIPlugins, "id", id)
	if err != nil {
		return nil, fmt.Errorf("state: plugin lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.CSIPlugin), nil
}

// CSIPlugins returns every plugin whose ID starts with prefix, by ID.
func (s *StateStore) CSIPlugins(ws memdb.WatchSet, prefix string) ([]*structs.CSIPlugin, error) {
	return getAll(s, ws, func(p *structs.CSIPlugin) string { return p.ID }, TableCSIPlugins, "id_prefix", prefix)
}

// UpsertCSIVolumes registers volumes or updates registrations, all or
// none. Claims are the store's to keep: an update keeps existing claims.
// An update is checked here, at apply time, with the same rules the leader
// checks before proposing it (structs.CheckCSIVolumeUpdate): a
// registration that raced another one, or a claim, past the leader's check
// is refused here, and then nothing of the batch is written.
func (s *StateStore) UpsertCSIVolumes(index uint64, vols []*structs.CSIVolume) error {
	txn := s.writeTxn()
	defer txn.Abort()
	for _, vol := range vols {
		if err := upsertCSIVolumeTxn(txn, index, vol); err != nil {
			return err
		}
	}
	if err := setIndexTxn(txn, TableCSIVolumes, index); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

func upsertCSIVolumeTxn(txn *memdb.Txn, index uint64, vol *structs.CSIVolume) error {
	v := vol.Copy()
	raw, err := txn.First(TableCSIVolumes, "id", v.Namespace, v.ID)
	if err != nil {
		return fmt.Errorf("state: volume lookup: %w", err)
	}
	if raw != nil {
		old := raw.(*structs.CSIVolume)
		v.InheritUnset(old)
		if err := structs.CheckCSIVolumeUpdate(old, v); err != nil {
			return err
		}
		v.CreateIndex = old.CreateIndex
		v.Claims = old.Copy().Claims
	} else {
		v.CreateIndex = index
		if v.Claims == nil {
			v.Claims = map[string]*structs.CSIVolumeClaim{}
		}
	}
	v.ModifyIndex = index
	if err := txn.Insert(TableCSIVolumes, v); err != nil {
		return fmt.Errorf("state: volume insert: %w", err)
	}
	return nil
}

// DeleteCSIVolumes removes volume registrations, all or none. A volume
// with claims is refused unless force, and even then while any claim may
// not be released yet (structs.CSIClaimReleasable). The leader checks the
// same before it proposes; checking again here keeps a claim reserved in
// between from being dropped with its volume.
func (s *StateStore) DeleteCSIVolumes(index uint64, namespace string, ids []string, force bool) error {
	txn := s.writeTxn()
	defer txn.Abort()
	for _, id := range ids {
		raw, err := txn.First(TableCSIVolumes, "id", namespace, id)
		if err != nil {
			return fmt.Errorf("state: volume lookup: %w", err)
		}
		if raw == nil {
			return fmt.Errorf("%w: volume %q", structs.ErrNotFound, id)
		}
		if err := deletableTxn(txn, raw.(*structs.CSIVolume), force); err != nil {
			return err
		}
		if err := txn.Delete(TableCSIVolumes, raw); err != nil {
			return fmt.Errorf("state: volume delete: %w", err)
		}
	}
	if err := setIndexTxn(txn, TableCSIVolumes, index); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// deletableTxn refuses to delete a volume whose claims must stay.
func deletableTxn(txn *memdb.Txn, v *structs.CSIVolume, force bool) error {
	if len(v.Claims) == 0 {
		return nil
	}
	if !force {
		return fmt.Errorf("%w: volume %q has %d claim(s)", structs.ErrInvalidRequest, v.ID, len(v.Claims))
	}
	for _, allocID := range slices.Sorted(maps.Keys(v.Claims)) {
		c := v.Claims[allocID]
		rawAlloc, err := txn.First(TableAllocs, "id", allocID)
		if err != nil {
			return fmt.Errorf("state: alloc lookup: %w", err)
		}
		rawNode, err := txn.First(TableNodes, "id", c.NodeID)
		if err != nil {
			return fmt.Errorf("state: node lookup: %w", err)
		}
		alloc, _ := rawAlloc.(*structs.Allocation)
		node, _ := rawNode.(*structs.Node)
		if !structs.CSIClaimReleasable(alloc, node) {
			return fmt.Errorf("%w: volume %q is claimed by allocation %s, whose tasks may still run",
				structs.ErrInvalidRequest, v.ID, allocID)
		}
	}
	return nil
}

// UpdateCSIVolumeClaim checkpoints one claim: a claim with a State is
// stored (replacing the allocation's previous record); a nil claim state
// "" frees it. It is the one write every claim transition goes through.
func (s *StateStore) UpdateCSIVolumeClaim(index uint64, namespace, volID string, claim *structs.CSIVolumeClaim) error {
	txn := s.writeTxn()
	defer txn.Abort()
	raw, err := txn.First(TableCSIVolumes, "id", namespace, volID)
	if err != nil {
		return fmt.Errorf("state: volume lookup: %w", err)
	}
	if raw == nil {
		return fmt.Errorf("%w: volume %q", structs.ErrNotFound, volID)
	}
	v := raw.(*structs.CSIVolume).Copy()
	_, had := v.Claims[claim.AllocationID]
	if claim.State == structs.CSIVolumeClaimStatePublishing && !had {
		// Admission is decided here, at apply time, as well as by the
		// leader before it proposes: two claims proposed together for a
		// single-writer volume cannot both be reserved.
		if err := v.CanClaim(claim); err != nil {
			return err
		}
	}
	if claim.State == "" {
		delete(v.Claims, claim.AllocationID)
	} else {
		c := *claim
		v.Claims[claim.AllocationID] = &c
	}
	v.ModifyIndex = index
	if err := txn.Insert(TableCSIVolumes, v); err != nil {
		return fmt.Errorf("state: volume insert: %w", err)
	}
	if err := setIndexTxn(txn, TableCSIVolumes, index); err != nil {
		return err
	}
	s.commit(txn, index)
	return nil
}

// CSIVolumeByID returns the volume or nil.
func (s *StateStore) CSIVolumeByID(ws memdb.WatchSet, namespace, id string) (*structs.CSIVolume, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableCSIVolumes, "id", namespace, id)
	if err != nil {
		return nil, fmt.Errorf("state: volume lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.CSIVolume), nil
}

// CSIVolumes returns every volume in namespace whose ID starts with
// prefix, by ID.
func (s *StateStore) CSIVolumes(ws memdb.WatchSet, namespace, prefix string) ([]*structs.CSIVolume, error) {
	return getAll(s, ws, func(v *structs.CSIVolume) string { return v.ID }, TableCSIVolumes, "id_prefix", namespace, prefix)
}

// CSIVolumesByPlugin returns the volumes of a plugin, by ID.
func (s *StateStore) CSIVolumesByPlugin(ws memdb.WatchSet, pluginID string) ([]*structs.CSIVolume, error) {
	return getAll(s, ws, func(v *structs.CSIVolume) string { return v.ID }, TableCSIVolumes, "plugin", pluginID)
}
