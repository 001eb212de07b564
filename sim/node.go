package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roamhq/roam/structs"
)

// node is one simulated client node.
type node struct {
	sim        *Sim
	index      int
	id, secret string
	name       string
	controller bool
	server     string
	source     string
	rpcSrv     *structs.RPCServer

	ctx    context.Context
	cancel context.CancelFunc

	registered atomic.Bool
	dead       atomic.Bool

	// mu guards the fields below it.
	mu   sync.Mutex
	sess *session
	ttl  time.Duration
	// allocs are the allocations the node runs, by ID.
	allocs map[string]*simAlloc
}

// simAlloc is an allocation the node reported running, and the volumes
// whose claims it holds.
type simAlloc struct {
	volumes []string
}

func newNode(s *Sim, i int) *node {
	ctx, cancel := context.WithCancel(s.ctx)
	server := s.cfg.Servers[i%len(s.cfg.Servers)]
	n := &node{
		sim: s, index: i, id: newID(), secret: newID(),
		name:       fmt.Sprintf("sim-%05d", i),
		controller: i < s.cfg.Controllers,
		server:     server,
		source:     sourceAddr(server, i, s.cfg.NodesPerAddr),
		ctx:        ctx, cancel: cancel,
		allocs: map[string]*simAlloc{},
	}
	n.rpcSrv = structs.NewRPCServer()
	// Registering fixed, valid services cannot fail.
	if err := n.rpcSrv.RegisterName("ClientCSI", &clientCSI{n: n}); err != nil {
		panic(err)
	}
	if err := n.rpcSrv.RegisterName("ClientStatus", &clientStatus{n: n}); err != nil {
		panic(err)
	}
	return n
}

// kill stops the node's loops and closes its session.
func (n *node) kill() {
	n.dead.Store(true)
	n.cancel()
	n.mu.Lock()
	if n.sess != nil {
		n.sess.close()
		n.sess = nil
	}
	n.mu.Unlock()
}

// conn returns the node's session, dialing its server if there is none.
func (n *node) conn() (*session, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() != nil {
		return nil, n.ctx.Err()
	}
	if n.sess != nil {
		return n.sess, nil
	}
	s, err := dialSession(n.server, n.source, 10*time.Second, n.rpcSrv, n.sim.logger, &n.sim.wg)
	if err != nil {
		return nil, err
	}
	n.sess = s
	return s, nil
}

func (n *node) dropConn(s *session) {
	n.mu.Lock()
	if n.sess == s {
		n.sess = nil
	}
	n.mu.Unlock()
	s.close()
}

// rpc makes one call as the node (its secret the token), retrying what
// the client agent retries (no leader, a lost connection) until ctx ends
// or the call timeout passes.
func (n *node) rpc(ctx context.Context, method string, args, reply any) error {
	return n.rpcRetrying(ctx, method, args, reply, false)
}

// claimRPC is rpc for volume claims and releases: like the client's
// callClaim it keeps retrying what may succeed later (a claim queued
// behind others in the plugin's lane past the call timeout, no leader)
// until the node stops.
func (n *node) claimRPC(ctx context.Context, args *structs.CSIVolumeClaimRequest, reply *structs.CSIVolumeClaimResponse) error {
	return n.rpcRetrying(ctx, "CSIVolume.Claim", args, reply, true)
}

// controllerWait is how long a claim waits for a reachable controller
// (the client's default CSIControllerWait).
const controllerWait = time.Minute

func (n *node) rpcRetrying(ctx context.Context, method string, args, reply any, forever bool) error {
	if a, ok := args.(interface{ SetAuth(region, token string) }); ok {
		a.SetAuth(n.sim.cfg.Region, n.secret)
	}
	// A blocking query's wait is not a lost connection.
	timeout := max(n.sim.cfg.CallTimeout, structs.RPCCallTimeout(args))
	deadline := time.Now().Add(timeout)
	wait := 100 * time.Millisecond
	for {
		s, err := n.conn()
		if err == nil {
			err = s.call(ctx, method, args, reply, timeout)
			if errors.Is(err, errConnLost) {
				n.dropConn(s)
			}
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || n.ctx.Err() != nil {
			return fmt.Errorf("%s: %w", method, context.Canceled)
		}
		// Claims also wait out a moment without a reachable controller,
		// as the client does for CSIControllerWait.
		controllerGone := forever && errors.Is(structs.FromRPCError(err), structs.ErrCSIControllerUnavailable) &&
			time.Since(deadline.Add(-timeout)) < controllerWait
		if !retryable(err) && !controllerGone && s != nil {
			return err
		}
		if !forever && time.Now().After(deadline) {
			return fmt.Errorf("%s: gave up: %w", method, err)
		}
		if err := backoff(ctx, wait); err != nil {
			return err
		}
		wait = min(wait*2, 2*time.Second)
	}
}

// buildNode is the node as its fingerprint would report it: raw_exec, the
// plugin's node service on every node and its controller on some, and
// room for AllocsPerNode allocations of the job (cpu.totalcompute).
func (n *node) buildNode() *structs.Node {
	now := time.Now()
	plugin := n.sim.cfg.PluginID
	node := &structs.Node{
		ID: n.id, SecretID: n.secret, Name: n.name, Datacenter: n.sim.cfg.Datacenter,
		Attributes: map[string]string{
			"kernel.name": "linux", "driver.raw_exec": "1",
			"cpu.totalcompute": fmt.Sprint(allocCPU * n.sim.cfg.AllocsPerNode), "memory.totalbytes": fmt.Sprint(1 << 30),
			"unique.network.ip-address": n.source,
		},
		Drivers: map[string]*structs.DriverInfo{
			"raw_exec": {Detected: true, Healthy: true, HealthDescription: "Healthy", UpdateTime: now,
				Attributes: map[string]string{"driver.raw_exec": "1"}},
		},
		CSINodePlugins: map[string]*structs.CSIInfo{plugin: {
			PluginID: plugin, Healthy: true, HealthDescription: "healthy", UpdateTime: now,
			Provider: "sim.roam", ProviderVersion: "1", RequiresControllerPlugin: true,
			NodeInfo: &structs.CSINodeInfo{ID: n.id, MaxVolumes: 1024},
		}},
		CSIControllerPlugins: map[string]*structs.CSIInfo{},
		Status:               structs.NodeStatusReady,
	}
	if n.controller {
		node.CSIControllerPlugins[plugin] = &structs.CSIInfo{
			PluginID: plugin, Healthy: true, HealthDescription: "healthy", UpdateTime: now,
			Provider: "sim.roam", ProviderVersion: "1", RequiresControllerPlugin: true,
			ControllerInfo: &structs.CSIControllerInfo{SupportsAttachDetach: true},
		}
	}
	return node
}

func (n *node) registerRetrying(ctx context.Context) error {
	var resp structs.NodeUpdateResponse
	req := &structs.NodeRegisterRequest{Node: n.buildNode(), IntroToken: n.sim.cfg.IntroToken}
	if err := n.rpc(ctx, "Node.Register", req, &resp); err != nil {
		return fmt.Errorf("sim: register %s: %w", n.name, err)
	}
	n.registered.Store(true)
	n.mu.Lock()
	n.ttl = resp.HeartbeatTTL
	n.mu.Unlock()
	return nil
}

// heartbeatLoop sends Node.UpdateStatus at half the TTL the servers gave,
// registering again when they forgot the node.
func (n *node) heartbeatLoop() {
	for {
		n.mu.Lock()
		next := n.ttl / 2
		n.mu.Unlock()
		if next <= 0 {
			next = time.Second
		}
		if err := backoff(n.ctx, 2*next); err != nil { // jittered around next
			return
		}
		var resp structs.NodeUpdateResponse
		err := n.rpc(n.ctx, "Node.UpdateStatus", &structs.NodeUpdateStatusRequest{NodeID: n.id, Status: structs.NodeStatusReady}, &resp)
		if errors.Is(err, structs.ErrUnknownNode) {
			err = n.registerRetrying(n.ctx)
		}
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			n.sim.heartbeatErr.Add(1)
			n.sim.logger.Warn("heartbeat failed", "node", n.name, "error", err)
			continue
		}
		n.sim.heartbeats.Add(1)
		if resp.HeartbeatTTL > 0 {
			n.mu.Lock()
			n.ttl = resp.HeartbeatTTL
			n.mu.Unlock()
		}
	}
}

// allocLoop follows the node's allocations with blocking queries, as the
// client's alloc watcher does, and runs or stops each.
func (n *node) allocLoop() {
	var index uint64
	for n.ctx.Err() == nil {
		req := &structs.NodeSpecificRequest{NodeID: n.id, QueryOptions: structs.QueryOptions{
			MinQueryIndex: index, MaxQueryTime: time.Minute}}
		var resp structs.NodeClientAllocsResponse
		if err := n.rpc(n.ctx, "Node.GetClientAllocs", req, &resp); err != nil {
			if n.ctx.Err() != nil {
				return
			}
			n.sim.logger.Warn("alloc query failed", "node", n.name, "error", err)
			_ = backoff(n.ctx, time.Second)
			continue
		}
		if resp.Index > index {
			index = resp.Index
		}
		for _, a := range resp.Allocs {
			n.reconcile(a)
		}
	}
}

// reconcile runs an allocation the servers want running and the node does
// not run yet (claim its volumes, report it running), and stops one they
// want stopped (release its claims, report it complete).
func (n *node) reconcile(a *structs.Allocation) {
	n.mu.Lock()
	_, running := n.allocs[a.ID]
	n.mu.Unlock()
	switch {
	case a.DesiredStatus == structs.AllocDesiredStatusRun && !running && !a.ClientTerminalStatus():
		vols, err := n.claimAll(a)
		status := structs.AllocClientStatusRunning
		if err != nil {
			n.sim.logger.Warn("claim failed", "node", n.name, "alloc_id", a.ID, "error", err)
			if n.ctx.Err() != nil {
				return
			}
			n.releaseAll(a, vols)
			status = structs.AllocClientStatusFailed
		} else {
			n.mu.Lock()
			n.allocs[a.ID] = &simAlloc{volumes: vols}
			n.mu.Unlock()
		}
		n.updateAlloc(a.ID, status)
	case a.DesiredStatus != structs.AllocDesiredStatusRun && running:
		n.mu.Lock()
		sa := n.allocs[a.ID]
		delete(n.allocs, a.ID)
		n.mu.Unlock()
		n.releaseAll(a, sa.volumes)
		n.updateAlloc(a.ID, structs.AllocClientStatusComplete)
	}
}

func (n *node) updateAlloc(id, status string) {
	req := &structs.AllocUpdateRequest{Alloc: []*structs.Allocation{{ID: id, ClientStatus: status}}}
	var resp structs.GenericResponse
	if err := n.rpc(n.ctx, "Node.UpdateAlloc", req, &resp); err != nil && n.ctx.Err() == nil {
		n.sim.logger.Warn("alloc update failed", "node", n.name, "alloc_id", id, "error", err)
	}
}

// claimAll claims every CSI volume the allocation's group asks for, in
// write mode, as the client's volume hook does before starting tasks, and
// returns the volumes it claimed.
func (n *node) claimAll(a *structs.Allocation) ([]string, error) {
	tg := groupOf(a)
	if tg == nil {
		return nil, nil
	}
	var out []string
	for _, req := range tg.Volumes {
		if req.Type != "csi" {
			continue
		}
		vol := req.Source
		if req.PerAlloc {
			vol = fmt.Sprintf("%s[%d]", req.Source, a.Index())
		}
		args := &structs.CSIVolumeClaimRequest{
			VolumeID: vol, AllocationID: a.ID, NodeID: n.id, Mode: structs.CSIVolumeClaimWrite,
			AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			State: structs.CSIVolumeClaimStateTaken,
		}
		start := time.Now()
		var resp structs.CSIVolumeClaimResponse
		if err := n.claimRPC(n.ctx, args, &resp); err != nil {
			return out, fmt.Errorf("claim %s: %w", vol, err)
		}
		n.sim.recordClaim(time.Since(start))
		out = append(out, vol)
	}
	return out, nil
}

// releaseAll walks each claim to freed, as the client does once its node
// plugin unpublished the volume.
func (n *node) releaseAll(a *structs.Allocation, vols []string) {
	for _, vol := range vols {
		args := &structs.CSIVolumeClaimRequest{VolumeID: vol, AllocationID: a.ID, NodeID: n.id,
			State: structs.CSIVolumeClaimStateUnpublishing}
		var resp structs.CSIVolumeClaimResponse
		if err := n.claimRPC(n.ctx, args, &resp); err != nil && n.ctx.Err() == nil {
			n.sim.logger.Warn("release failed", "node", n.name, "volume_id", vol, "error", err)
		}
	}
}

func groupOf(a *structs.Allocation) *structs.TaskGroup {
	if a.Job == nil {
		return nil
	}
	for _, tg := range a.Job.TaskGroups {
		if tg.Name == a.TaskGroup {
			return tg
		}
	}
	return nil
}

// holding returns how many allocations the node runs and how many claims
// they hold.
func (n *node) holding() (allocs, claims int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range n.allocs {
		allocs++
		claims += len(a.volumes)
	}
	return allocs, claims
}

// usersOf names the node's allocations holding volumeID.
func (n *node) usersOf(volumeID string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for id, a := range n.allocs {
		for _, v := range a.volumes {
			if v == volumeID {
				out = append(out, id)
			}
		}
	}
	return out
}
