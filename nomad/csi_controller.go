package nomad

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// errControllerUnavailable means a controller call did not reach the plugin
// on that node: the plugin is missing on the client, the client is
// unreachable, or no server holds a connection to it. The transport wraps
// its errors with it; callController then tries the next candidate. It
// never stands for an answer from the plugin itself.
var errControllerUnavailable = structs.ErrCSIControllerUnavailable

// controllerUnavailable says whether err means the call never reached the
// plugin on that node. Besides errControllerUnavailable it accepts the
// structs sentinels that say the same after an RPC hop, where an unexported
// value cannot travel: the client has no such plugin, or no server holds
// the client's session.
func controllerUnavailable(err error) bool {
	err = structs.FromRPCError(err)
	return errors.Is(err, errControllerUnavailable) ||
		errors.Is(err, structs.ErrCSIPluginNotFound) ||
		errors.Is(err, structs.ErrNodeNotConnected)
}

// controllerCandidates returns the nodes that may serve a controller call
// for pluginID: those whose status is ready and whose controller instance
// of the plugin is healthy, sorted by node ID, lowest first. Eligibility
// and drain do not matter: a draining or ineligible node still runs its
// controller, and skipping it has left volumes attached. nodes is not
// modified.
func controllerCandidates(nodes []*structs.Node, pluginID string) []*structs.Node {
	var out []*structs.Node
	for _, n := range nodes {
		if n == nil || !n.Ready() {
			continue
		}
		if info := n.CSIControllerPlugins[pluginID]; info != nil && info.Healthy {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *structs.Node) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// pluginControllers is controllerCandidates for pluginID as the state is
// now, read from the state store's index of ready nodes with a healthy
// controller of the plugin, already in node ID order. The sequence is
// lazy: this runs inside the plugin's lane, once per destructive call, and
// the usual call takes the first candidate and stops, at a cost that does
// not grow with the number of nodes.
func pluginControllers(store *state.StateStore, pluginID string) (iter.Seq[*structs.Node], error) {
	return store.CSIControllerCandidates(pluginID)
}

// EnvDisableControllerFence names the switch that turns off both
// controller fences (fence_switch_roamfaults.go). Only a binary built with
// the roamfaults tag reads it: the e2e partition scenarios build one to
// show they catch a missing fence (docs/faults.md). A production build
// cannot turn the fences off.
const EnvDisableControllerFence = "ROAM_TEST_DISABLE_CONTROLLER_FENCE"

// EnvDisableRaftLogGuard, set to "1" in a roamfaults build, leaves the raft
// log unguarded (see raftlog): the e2e disk-full scenario builds one to show
// that a server whose log failed a write then falls behind for good.
const EnvDisableRaftLogGuard = "ROAM_TEST_DISABLE_RAFT_LOG_GUARD"

var fenceOffWarning sync.Once

// fence pins a plugin's destructive calls to the node where a call's
// outcome is unknown (the connection to its client was lost mid-call): that
// call may still be running there, and only that client's own lane makes
// the next call wait for it. Another node's controller would reach the
// storage provider at the same time. The fence lifts when a call on the
// node succeeds (its client's lane has then finished the earlier one) or
// when the earlier call must have hit its own deadline.
type fence struct {
	nodeID string
	until  time.Time
}

// fencedTo returns the node pluginID's calls are pinned to, if any.
func (l *controllerLanes) fencedTo(pluginID string, now time.Time) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.fences[pluginID]
	if !ok {
		return "", false
	}
	if !now.Before(f.until) {
		delete(l.fences, pluginID)
		return "", false
	}
	return f.nodeID, true
}

func (l *controllerLanes) setFence(pluginID, nodeID string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fences[pluginID] = fence{nodeID: nodeID, until: until}
}

// liftFence lifts pluginID's fence if it pins the plugin to nodeID.
func (l *controllerLanes) liftFence(pluginID, nodeID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.fences[pluginID]; ok && f.nodeID == nodeID {
		delete(l.fences, pluginID)
	}
}

// sendingTo is, for one plugin, the controller node its calls are in
// flight on and how many; guarded by controllerLanes.mu.
type sendingTo struct {
	nodeID string
	n      int
}

// enterNode admits a call of pluginID to nodeID unless calls of the plugin
// are in flight on another node; an admitted call must leaveNode when it
// returns. With one call at a time a call moved to another controller only
// once nothing else was in flight, so every fence named the only node with
// a call running; with several this keeps it so: the plugin's calls
// change nodes only when the node they leave has none left running.
func (l *controllerLanes) enterNode(pluginID, nodeID string) (busyOn string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sending[pluginID]
	if s.n > 0 && s.nodeID != nodeID {
		return s.nodeID, false
	}
	l.sending[pluginID] = sendingTo{nodeID: nodeID, n: s.n + 1}
	return "", true
}

func (l *controllerLanes) leaveNode(pluginID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sending[pluginID]
	if s.n <= 1 {
		delete(l.sending, pluginID)
		return
	}
	s.n--
	l.sending[pluginID] = s
}

// markIdle records that a controller call on nodeID was answered.
func (l *controllerLanes) markIdle(pluginID, nodeID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idle[pluginID] = nodeID
}

// knownIdle reports whether this leader has seen a call on nodeID answered
// since it took over.
func (l *controllerLanes) knownIdle(pluginID, nodeID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle[pluginID] == nodeID
}

// recordedFenceCandidates applies the fence recorded in Raft (see
// structs.CSIControllerFence) to candidates: while this leader has not
// seen a call answered on the recorded node, and that node is not down,
// only that node may be called. If it is not among the candidates (its
// controller unhealthy, or the node disconnected but not yet down), the
// caller is told to come back: the error is retryable.
func recordedFenceCandidates(pluginID string, candidates iter.Seq[*structs.Node], rec *structs.CSIControllerFence, node *structs.Node) (iter.Seq[*structs.Node], error) {
	if node == nil || node.Status == structs.NodeStatusDown {
		return candidates, nil
	}
	for n := range candidates {
		if n.ID == rec.NodeID {
			return slices.Values([]*structs.Node{n}), nil
		}
	}
	return nil, fmt.Errorf("%w: plugin %q: an earlier leader sent a controller call to node %s that may still be running; "+
		"no other controller is called until that node answers or is down", structs.ErrClaimInProgress, pluginID, rec.NodeID)
}

// fencedCandidates narrows candidates to the fenced node. With the node
// not among them (down, or its controller unhealthy), the call must wait:
// the error is retryable and says why.
func fencedCandidates(pluginID string, candidates iter.Seq[*structs.Node], nodeID string) (iter.Seq[*structs.Node], error) {
	for n := range candidates {
		if n.ID == nodeID {
			return slices.Values([]*structs.Node{n}), nil
		}
	}
	return nil, fmt.Errorf("%w: plugin %q: a controller call on node %s may still be running (its outcome is unknown); "+
		"no other controller is called until it is known finished", structs.ErrClaimInProgress, pluginID, nodeID)
}

// callController tries call on each candidate in order and returns the node
// that answered with the answer's error (nil on success).
//
// An error for which controllerUnavailable holds moves to the next candidate.
// Any other error is returned at once, unretried elsewhere:
//   - one of structs.IsRetryable's (the leader is going away, or the outcome
//     is unknown) comes with a nil node: no other node fixes it, and the
//     caller retries against the new leader. This check comes first, so an
//     error that is also unavailable is returned too.
//   - anything else is the plugin's own answer (InvalidArgument, NotFound,
//     …) and comes with the node that gave it.
//
// With no candidates, or when every one is unavailable, the error wraps
// errControllerUnavailable (and the last attempt's error) and names
// pluginID; the node is nil. If ctx ends between attempts, its error is
// returned, wrapped.
func callController(ctx context.Context, pluginID string, candidates iter.Seq[*structs.Node],
	call func(ctx context.Context, node *structs.Node) error) (*structs.Node, error) {
	var (
		last  error
		tried int
	)
	if candidates == nil { // no candidates at all
		candidates = func(func(*structs.Node) bool) {}
	}
	for node := range candidates {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return nil, fmt.Errorf("plugin %q: %w (last attempt: %v)", pluginID, err, last)
			}
			return nil, fmt.Errorf("plugin %q: %w", pluginID, err)
		}
		tried++
		err := call(ctx, node)
		switch {
		case err == nil:
			return node, nil
		case structs.IsRetryable(err):
			return nil, err
		case controllerUnavailable(err):
			last = fmt.Errorf("node %s: %w", node.ID, err)
		default:
			return node, err
		}
	}
	if tried == 0 {
		return nil, fmt.Errorf("%w: plugin %q has no healthy controller on a ready node",
			errControllerUnavailable, pluginID)
	}
	return nil, fmt.Errorf("%w: plugin %q: all %d candidates failed, last on %w",
		errControllerUnavailable, pluginID, tried, last)
}
