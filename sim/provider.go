package sim

import (
	"fmt"
	"sync"
	"time"

	"github.com/roamhq/roam/structs"
)

// provider is the storage provider behind every simulated controller: it
// records what is attached where, and counts destructive calls that
// overlap (across every controller instance of the process, as the e2e
// fault harness counts them on disk).
type provider struct {
	latency time.Duration

	// mu guards the fields below it.
	mu          sync.Mutex
	attached    map[string]string // external volume ID -> CSI node ID
	inFlight    int
	maxInFlight int
	overlaps    int64
	publishes   int64
	unpublishes int64
}

func newProvider(latency time.Duration) *provider {
	return &provider{latency: latency, attached: map[string]string{}}
}

// enter starts one destructive call; the returned func ends it.
func (p *provider) enter() func() {
	p.mu.Lock()
	p.inFlight++
	if p.inFlight > 1 {
		p.overlaps++
	}
	p.maxInFlight = max(p.maxInFlight, p.inFlight)
	p.mu.Unlock()
	if p.latency > 0 {
		time.Sleep(p.latency) // the provider's own work, not a test wait
	}
	return func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}
}

func (p *provider) publish(volumeID, nodeID string) error {
	defer p.enter()()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.publishes++
	if cur, ok := p.attached[volumeID]; ok && cur != nodeID {
		return fmt.Errorf("%w: volume %s is attached to node %s", structs.ErrCSIFailedPrecondition, volumeID, cur)
	}
	p.attached[volumeID] = nodeID
	return nil
}

func (p *provider) unpublish(volumeID, nodeID string) {
	defer p.enter()()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unpublishes++
	if cur, ok := p.attached[volumeID]; ok && (nodeID == "" || cur == nodeID) {
		delete(p.attached, volumeID)
	}
}

// clientCSI is the ClientCSI service of one simulated node: controller
// calls go to the provider, node calls are answered from the node's own
// record of what it holds.
type clientCSI struct {
	n *node
}

func (c *clientCSI) plugin(id string) error {
	if id != c.n.sim.cfg.PluginID {
		return fmt.Errorf("%w: %q", structs.ErrCSIPluginNotFound, id)
	}
	return nil
}

func (c *clientCSI) controller(id string) error {
	if err := c.plugin(id); err != nil {
		return err
	}
	if !c.n.controller {
		return fmt.Errorf("%w: %q has no controller on this node", structs.ErrCSIPluginNotFound, id)
	}
	return nil
}

// ControllerAttachVolume publishes a volume to a node.
func (c *clientCSI) ControllerAttachVolume(args *structs.ClientCSIControllerAttachVolumeRequest, reply *structs.ClientCSIControllerAttachVolumeResponse) error {
	if err := c.controller(args.PluginID); err != nil {
		return err
	}
	if args.VolumeID == "" || args.ClientCSINodeID == "" {
		return fmt.Errorf("%w: volume ID and node ID are required", structs.ErrCSIInvalidArgument)
	}
	if err := c.n.sim.prov.publish(args.VolumeID, args.ClientCSINodeID); err != nil {
		return err
	}
	reply.PublishContext = map[string]string{"device": "/dev/sim"}
	return nil
}

// ControllerDetachVolume unpublishes a volume from a node.
func (c *clientCSI) ControllerDetachVolume(args *structs.ClientCSIControllerDetachVolumeRequest, _ *structs.ClientCSIControllerDetachVolumeResponse) error {
	if err := c.controller(args.PluginID); err != nil {
		return err
	}
	if args.VolumeID == "" {
		return fmt.Errorf("%w: volume ID is required", structs.ErrCSIInvalidArgument)
	}
	c.n.sim.prov.unpublish(args.VolumeID, args.ClientCSINodeID)
	return nil
}

// NodeDetachVolume unpublishes and unstages a volume on this node: the
// simulated node mounts nothing, so there is nothing to undo.
func (c *clientCSI) NodeDetachVolume(args *structs.ClientCSINodeDetachVolumeRequest, _ *structs.ClientCSINodeDetachVolumeResponse) error {
	return c.plugin(args.PluginID)
}

// NodeVolumeUsers names the allocations of this node that hold the volume.
func (c *clientCSI) NodeVolumeUsers(args *structs.ClientCSINodeVolumeUsersRequest, reply *structs.ClientCSINodeVolumeUsersResponse) error {
	if err := c.plugin(args.PluginID); err != nil {
		return err
	}
	reply.AllocIDs = c.n.usersOf(args.VolumeID)
	return nil
}

// clientStatus answers the servers' liveness checks.
type clientStatus struct {
	n *node
}

// Ping answers with the node's ID.
func (s *clientStatus) Ping(_ *structs.GenericRequest, reply *structs.ClientStatusPingResponse) error {
	reply.NodeID = s.n.id
	return nil
}
