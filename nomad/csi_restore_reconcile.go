package nomad

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	metrics "github.com/hashicorp/go-metrics"

	"github.com/roamhq/roam/internal/laneadmit"
	"github.com/roamhq/roam/structs"
)

// After a snapshot restore the provider may hold attachments the restored
// state knows nothing of: a volume published after the snapshot was taken
// has no claim for that node. The leader asks each plugin that can say
// (ListVolumes with published nodes) and unpublishes, through the
// plugin's lane, an attachment that no claim explains and that the node
// itself no longer uses. One the node still uses is never unpublished.

const (
	// restoreReconcileRetry is how long the leader waits before asking
	// again about attachments it could not decide (client unreachable, or
	// the node still using the volume).
	restoreReconcileRetry = 5 * time.Second
	// restoreReconcileFor bounds how long after a restore the leader keeps
	// asking; what is still undecided then is logged and left.
	restoreReconcileFor = 10 * time.Minute
	// restoreReconcileMaxPages bounds one plugin's listing (at
	// structs.MaxExternalPerPage volumes a page).
	restoreReconcileMaxPages = 1000
)

// publishedAction is what the leader does with one provider attachment
// (a volume published to a node) after a restore.
type publishedAction int

const (
	// publishedNotListed: the plugin cannot list published nodes; nothing
	// is checked.
	publishedNotListed publishedAction = iota
	// publishedClaimed: a restored claim names the node. The claim is the
	// volume watcher's; no second publish, no unpublish here.
	publishedClaimed
	// publishedForeign: not a volume Roam has registered for the plugin,
	// or a provider node no Roam node reports. Left alone.
	publishedForeign
	// publishedAskAgain: the node could not be asked; ask again later.
	publishedAskAgain
	// publishedInUse: the node still uses the volume (an allocation the
	// restored state does not know has it mounted). Never unpublished
	// from under it; asked again later, as the allocation may stop.
	publishedInUse
	// publishedUnpublish: no claim, and the node does not use it.
	publishedUnpublish
)

func (a publishedAction) String() string {
	switch a {
	case publishedNotListed:
		return "not-listed"
	case publishedClaimed:
		return "claimed"
	case publishedForeign:
		return "foreign"
	case publishedAskAgain:
		return "ask-again"
	case publishedInUse:
		return "in-use"
	case publishedUnpublish:
		return "unpublish"
	}
	return fmt.Sprintf("publishedAction(%d)", int(a))
}

// publishedInput is what decidePublished looks at for one attachment.
type publishedInput struct {
	// CanList: a controller of the plugin advertises LIST_VOLUMES and
	// LIST_VOLUMES_PUBLISHED_NODES.
	CanList bool
	// Registered: the provider's volume is registered in Roam.
	Registered bool
	// Claimed: a claim of the volume names the attached node.
	Claimed bool
	// NodeKnown: a Roam node reports the provider's node ID.
	NodeKnown bool
	// Asked: the node was asked what uses the volume; UsersErr is the
	// error asking it, Users its answer.
	Asked    bool
	UsersErr error
	Users    *structs.ClientCSINodeVolumeUsersResponse
}

// decidePublished decides what to do with one provider attachment. Only
// a registered volume, unclaimed on that node, whose node answered that
// nothing there uses it, is unpublished.
func decidePublished(in publishedInput) publishedAction {
	switch {
	case !in.CanList:
		return publishedNotListed
	case !in.Registered:
		return publishedForeign
	case in.Claimed:
		return publishedClaimed
	case !in.NodeKnown:
		return publishedForeign
	case !in.Asked || in.UsersErr != nil || in.Users == nil:
		return publishedAskAgain
	case in.Users.InUse():
		return publishedInUse
	}
	return publishedUnpublish
}

// canListPublished says whether a controller of the plugin lists volumes
// with the nodes they are published to.
func canListPublished(p *structs.CSIPlugin) bool {
	if p == nil {
		return false
	}
	for _, ci := range p.Controllers {
		if ci != nil && ci.Healthy && ci.ControllerInfo != nil &&
			ci.ControllerInfo.SupportsListVolumes && ci.ControllerInfo.SupportsListVolumesAttachedNodes {
			return true
		}
	}
	return false
}

// claimNamesNode says whether a claim of vol is on the node, by Roam node
// ID or by the provider's node ID.
func claimNamesNode(vol *structs.CSIVolume, nodeID, externalNodeID string) bool {
	for _, c := range vol.Claims {
		if c == nil {
			continue
		}
		if (nodeID != "" && c.NodeID == nodeID) || c.ExternalNodeID == externalNodeID {
			return true
		}
	}
	return false
}

// attachKey names one attachment: a plugin's volume on a provider node.
type attachKey struct{ plugin, external, node string }

// restoreReconcile is one run of the post-restore check, across passes.
type restoreReconcile struct {
	s *Server
	// done holds the attachments decided for good (unpublished, or
	// found claimed), so each is unpublished at most once.
	done map[attachKey]bool
}

// runRestoreReconcile checks the provider's attachments against the
// restored claims until every one is decided, the leader's term ends, or
// restoreReconcileFor has passed.
func (s *Server) runRestoreReconcile(ctx context.Context) {
	r := &restoreReconcile{s: s, done: map[attachKey]bool{}}
	deadline := time.Now().Add(restoreReconcileFor)
	for pass := 1; ; pass++ {
		pending := r.pass(ctx)
		if pending == 0 {
			s.logger.Info("restore reconcile: provider attachments checked against the restored claims", "passes", pass)
			return
		}
		if time.Now().After(deadline) {
			s.logger.Warn("restore reconcile: giving up on attachments still undecided; they stay published",
				"pending", pending, "passes", pass, "after", restoreReconcileFor)
			return
		}
		t := time.NewTimer(restoreReconcileRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			s.logger.Warn("restore reconcile: stopped with attachments undecided (leadership ended)", "pending", pending)
			return
		case <-t.C:
		}
	}
}

// pass checks every plugin once and returns how many attachments are
// still undecided.
func (r *restoreReconcile) pass(ctx context.Context) int {
	store := r.s.State()
	plugins, err := store.CSIPlugins(nil, "")
	if err != nil {
		r.s.logger.Error("restore reconcile: reading plugins", "error", err)
		return 1
	}
	pending := 0
	for _, p := range plugins {
		if ctx.Err() != nil {
			return pending + 1
		}
		if !canListPublished(p) {
			r.s.logger.Debug("restore reconcile: plugin does not list published nodes; restored claims are checked against clients only",
				"plugin_id", p.ID)
			continue
		}
		n, err := r.plugin(ctx, p.ID)
		if err != nil {
			r.s.logger.Warn("restore reconcile: plugin not checked; asking again", "plugin_id", p.ID, "error", err)
			pending++
		}
		pending += n
	}
	return pending
}

// listPublished lists every volume of the plugin with its published
// nodes, page by page.
func (r *restoreReconcile) listPublished(ctx context.Context, pluginID string) ([]*structs.CSIVolumeExternalStub, error) {
	var (
		all   []*structs.CSIVolumeExternalStub
		token string
	)
	for range restoreReconcileMaxPages {
		candidates, err := pluginControllers(r.s.State(), pluginID)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, csiCallTimeout)
		var resp structs.ClientCSIControllerListVolumesResponse
		_, err = callController(cctx, pluginID, candidates, func(ctx context.Context, cn *structs.Node) error {
			req := structs.ClientCSIControllerListVolumesRequest{
				PluginID: pluginID, MaxEntries: structs.MaxExternalPerPage, StartingToken: token,
				CSIControllerQuery: controllerQuery(ctx, cn),
			}
			resp = structs.ClientCSIControllerListVolumesResponse{}
			return r.s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerListVolumes", &req, &resp)
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("listing volumes: %w", err)
		}
		all = append(all, resp.Volumes...)
		if resp.NextToken == "" {
			return all, nil
		}
		if resp.NextToken == token {
			return nil, fmt.Errorf("listing volumes: the plugin returned the same next token %q twice", token)
		}
		token = resp.NextToken
	}
	return nil, fmt.Errorf("listing volumes: more than %d pages", restoreReconcileMaxPages)
}

// plugin checks one plugin's attachments and returns how many are still
// undecided.
func (r *restoreReconcile) plugin(ctx context.Context, pluginID string) (int, error) {
	listed, err := r.listPublished(ctx, pluginID)
	if err != nil {
		return 0, err
	}
	store := r.s.State()
	vols, err := store.CSIVolumesByPlugin(nil, pluginID)
	if err != nil {
		return 0, err
	}
	byExternal := make(map[string]*structs.CSIVolume, len(vols))
	for _, v := range vols {
		byExternal[v.ExternalID] = v
	}
	nodes, err := store.Nodes(nil)
	if err != nil {
		return 0, err
	}
	byProviderNode := map[string]*structs.Node{}
	for _, n := range nodes {
		if info := n.CSINodePlugins[pluginID]; info != nil && info.NodeInfo != nil && info.NodeInfo.ID != "" {
			byProviderNode[info.NodeInfo.ID] = n
		}
	}
	sort.Slice(listed, func(i, j int) bool { return listed[i].ExternalID < listed[j].ExternalID })
	pending := 0
	for _, ext := range listed {
		if ext == nil {
			continue
		}
		for _, extNode := range ext.PublishedExternalNodeIDs {
			k := attachKey{pluginID, ext.ExternalID, extNode}
			if r.done[k] {
				continue
			}
			vol := byExternal[ext.ExternalID]
			node := byProviderNode[extNode]
			in := publishedInput{CanList: true, Registered: vol != nil, NodeKnown: node != nil}
			nodeID := ""
			if node != nil {
				nodeID = node.ID
			}
			if vol != nil {
				in.Claimed = claimNamesNode(vol, nodeID, extNode)
			}
			if in.Registered && !in.Claimed && in.NodeKnown {
				in.Asked = true
				in.Users, in.UsersErr = r.askUsers(ctx, node.ID, pluginID, vol.ID)
			}
			action := decidePublished(in)
			log := r.s.logger.With("plugin_id", pluginID, "external_id", ext.ExternalID, "provider_node_id", extNode, "node_id", nodeID)
			switch action {
			case publishedClaimed:
				r.done[k] = true
			case publishedForeign:
				log.Debug("restore reconcile: attachment of a volume or node roam does not know; left alone")
				r.done[k] = true
			case publishedAskAgain:
				log.Info("restore reconcile: could not ask the node what uses the volume; asking again", "error", in.UsersErr)
				pending++
			case publishedInUse:
				log.Warn("restore reconcile: volume published with no restored claim, but still in use on its node; left published",
					"volume_id", vol.ID, "allocs", in.Users.AllocIDs, "staged", in.Users.Staged)
				metrics.IncrCounter([]string{"csi", "restore_reconcile", "kept_in_use"}, 1)
				pending++
			case publishedUnpublish:
				err := r.unpublish(ctx, vol, nodeID, extNode)
				switch {
				case errors.Is(err, errClaimAppeared):
					log.Info("restore reconcile: a claim for the attachment appeared; left to it", "volume_id", vol.ID)
					r.done[k] = true
				case err != nil:
					log.Warn("restore reconcile: unpublish failed; asking again", "volume_id", vol.ID, "error", err)
					pending++
				default:
					log.Info("restore reconcile: unpublished a volume no restored claim explains and its node no longer uses",
						"volume_id", vol.ID)
					metrics.IncrCounter([]string{"csi", "restore_reconcile", "unpublished"}, 1)
					r.done[k] = true
				}
			}
		}
	}
	return pending, nil
}

// askUsers asks the node, over its session, what uses the volume there.
func (r *restoreReconcile) askUsers(ctx context.Context, nodeID, pluginID, volID string) (*structs.ClientCSINodeVolumeUsersResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.config.CSINodeDetachTimeout)
	defer cancel()
	req := structs.ClientCSINodeVolumeUsersRequest{PluginID: pluginID, VolumeID: volID}
	var resp structs.ClientCSINodeVolumeUsersResponse
	if err := r.s.clientRPC(ctx, nodeID, "ClientCSI.NodeVolumeUsers", &req, &resp); err != nil {
		return nil, fmt.Errorf("asking node %s what uses volume %s: %w", nodeID, volID, err)
	}
	return &resp, nil
}

// errClaimAppeared: a claim naming the node showed up between the check
// and the unpublish's turn in the lane.
var errClaimAppeared = errors.New("a claim for the attachment appeared")

// unpublish detaches the volume from the provider node through the
// plugin's lane. Inside the lane, where every controller publish also
// runs, the claims are read again: a claim reserved meanwhile for that
// node (its publish waits behind this call) keeps the attachment.
func (r *restoreReconcile) unpublish(ctx context.Context, vol *structs.CSIVolume, nodeID, extNode string) error {
	var resp structs.ClientCSIControllerDetachVolumeResponse
	key := laneadmit.Call{Volume: laneadmit.VolumeKey(vol.ExternalID), Node: nodeID}
	return r.s.onController(ctx, vol.PluginID, "unpublish", key, &resp.CSIControllerReply, func(ctx context.Context, cn *structs.Node) error {
		latest, err := r.s.State().CSIVolumeByID(nil, structs.DefaultNamespace, vol.ID)
		if err != nil {
			return err
		}
		if latest == nil {
			return fmt.Errorf("%w: volume %q was deregistered", errClaimAppeared, vol.ID)
		}
		if claimNamesNode(latest, nodeID, extNode) {
			return errClaimAppeared
		}
		req := structs.ClientCSIControllerDetachVolumeRequest{
			PluginID: latest.PluginID, VolumeID: latest.ExternalID, ClientCSINodeID: extNode,
			Secrets: latest.Secrets, CSIControllerQuery: controllerQuery(ctx, cn),
		}
		return r.s.clientRPC(ctx, cn.ID, "ClientCSI.ControllerDetachVolume", &req, &resp)
	})
}
