package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/roamhq/roam/structs"
)

// csiClaimVolumeID is the volume a group's request names for alloc: a
// per-alloc request adds the allocation's index, as in "data[2]".
func csiClaimVolumeID(alloc *structs.Allocation, req *structs.VolumeRequest) string {
	if req.PerAlloc {
		return req.Source + fmt.Sprintf("[%d]", alloc.Index())
	}
	return req.Source
}

// csiClaimRequest builds the CSIVolume.Claim request taking a group's
// volume for alloc on this node.
func csiClaimRequest(nodeID string, alloc *structs.Allocation, req *structs.VolumeRequest) *structs.CSIVolumeClaimRequest {
	mode := structs.CSIVolumeClaimWrite
	if req.ReadOnly {
		mode = structs.CSIVolumeClaimRead
	}
	access, attach := req.AccessMode, req.AttachmentMode
	if access == "" {
		access = structs.CSIAccessModeSingleNodeWriter
	}
	if attach == "" {
		attach = structs.CSIAttachmentModeFilesystem
	}
	return &structs.CSIVolumeClaimRequest{
		VolumeID:       csiClaimVolumeID(alloc, req),
		AllocationID:   alloc.ID,
		NodeID:         nodeID,
		Mode:           mode,
		AccessMode:     access,
		AttachmentMode: attach,
		State:          structs.CSIVolumeClaimStateTaken,
	}
}

// claimRetryPolicy says whether a failed claim may succeed if sent again:
// whatever retryableCall allows (Client.RPC already retries those for a
// while; past its timeout the server may still come back, after a long
// election or a claim held by another request, so the claim keeps trying
// while the caller waits), and also waits up to wait for a
// controller when the servers find none reachable: that is often a
// moment's state (the controller's node reconnecting to another server
// after a restart), but a plugin that lost its controllers for good must
// fail the allocation rather than hold it pending.
func claimRetryPolicy(wait time.Duration, now func() time.Time) func(error) bool {
	var since time.Time
	return func(err error) bool {
		if retryableCall(err) {
			return true
		}
		// No controller to call, or the one called could not take the
		// call now (the plugin's UNAVAILABLE: the servers kept the
		// reservation for a retry): retried for as long as the client
		// waits for controllers.
		if e := structs.FromRPCError(err); !errors.Is(e, structs.ErrCSIControllerUnavailable) && !errors.Is(e, structs.ErrCSIUnavailable) {
			return false
		}
		if since.IsZero() {
			since = now()
		}
		return now().Sub(since) < wait
	}
}

// releaseRetryable says whether a failed release may succeed if sent
// again. Everything but a refusal may: a controller that is briefly
// unreachable, a node connection being re-established. The claim is
// checkpointed at each step, so a resent release resumes where it stopped.
func releaseRetryable(err error) bool {
	err = structs.FromRPCError(err)
	return !errors.Is(err, structs.ErrNotFound) && !errors.Is(err, structs.ErrPermissionDenied) &&
		!errors.Is(err, structs.ErrInvalidRequest)
}

// callClaim sends CSIVolume.Claim until it succeeds, fails for good
// (retryable says which errors are not), or ctx ends. Claims are
// idempotent on the server (a retried claim is answered from its
// checkpoint), so resending is safe.
func (c *Client) callClaim(ctx context.Context, args *structs.CSIVolumeClaimRequest, reply *structs.CSIVolumeClaimResponse, retryable func(error) bool) error {
	backoff := c.config.MinRetryBackoff
	for attempt := 1; ; attempt++ {
		// Each attempt gets a fresh request: RPC fills in auth on it.
		a := *args
		*reply = structs.CSIVolumeClaimResponse{}
		err := c.RPC("CSIVolume.Claim", &a, reply)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrShutdown) || !retryable(err) {
			return err
		}
		c.logger.Warn("volume claim call failed, retrying", "volume_id", args.VolumeID, "alloc_id", args.AllocationID,
			"state", args.State, "attempt", attempt, "error", err)
		wait := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-c.shutdownCtx.Done():
			t.Stop()
			return ErrShutdown
		}
		backoff = min(backoff*2, c.config.MaxRetryBackoff)
	}
}

// claimCSIVolume is the volume manager's CSIClaimFunc: it claims the
// volume from the servers, which publish it at the controller, and returns
// what the node plugin needs to mount it. It keeps trying through leader
// elections and concurrent claims until the allocation runner gives up
// (ctx); an error the servers give for good (no room on the volume, no
// such volume, not allowed) fails the allocation.
func (c *Client) claimCSIVolume(ctx context.Context, alloc *structs.Allocation, req *structs.VolumeRequest) (*CSIMountClaim, error) {
	args := csiClaimRequest(c.id.NodeID, alloc, req)
	var reply structs.CSIVolumeClaimResponse
	if err := c.callClaim(ctx, args, &reply, claimRetryPolicy(c.config.CSIControllerWait, time.Now)); err != nil {
		return nil, csiClaimError(args, err)
	}
	if reply.Volume == nil {
		return nil, fmt.Errorf("claim volume %q: server returned no volume", args.VolumeID)
	}
	return &CSIMountClaim{
		Volume:         reply.Volume,
		PublishContext: reply.PublishContext,
		AccessMode:     args.AccessMode,
		AttachmentMode: args.AttachmentMode,
	}, nil
}

// csiClaimError says why a claim failed in words an operator reading the
// allocation's task events can act on.
func csiClaimError(args *structs.CSIVolumeClaimRequest, err error) error {
	err = structs.FromRPCError(err)
	var why string
	switch {
	case errors.Is(err, structs.ErrCSIMaxClaims):
		why = fmt.Sprintf("volume %q has no room for another %s claim in %s mode", args.VolumeID, args.Mode, args.AccessMode)
	case errors.Is(err, structs.ErrNotFound):
		why = fmt.Sprintf("volume %q is not registered (or the allocation is gone)", args.VolumeID)
	case errors.Is(err, structs.ErrPermissionDenied):
		why = fmt.Sprintf("this node may not claim volume %q", args.VolumeID)
	case errors.Is(err, structs.ErrInvalidRequest):
		why = fmt.Sprintf("the servers refused the claim on volume %q", args.VolumeID)
	default:
		why = fmt.Sprintf("claim volume %q", args.VolumeID)
	}
	return fmt.Errorf("%s: %w", why, err)
}

// releaseCSIVolume is the volume manager's CSIReleaseFunc: once the node
// has unpublished and unstaged the volume, it asks the servers to walk the
// claim to freed (detaching at the controller). It keeps trying until that
// is done or the client shuts down, not merely until the caller's context
// ends: a claim left behind holds the volume. A volume the servers no
// longer know has nothing left to release.
func (c *Client) releaseCSIVolume(ctx context.Context, alloc *structs.Allocation, volumeID string) error {
	args := &structs.CSIVolumeClaimRequest{
		VolumeID:     volumeID,
		AllocationID: alloc.ID,
		NodeID:       c.id.NodeID,
		State:        structs.CSIVolumeClaimStateUnpublishing,
	}
	// Bounded by shutdown only; the caller's values are kept for tracing.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(c.shutdownCtx, cancel)
	defer stop()
	var reply structs.CSIVolumeClaimResponse
	err := c.callClaim(rctx, args, &reply, releaseRetryable)
	if errors.Is(structs.FromRPCError(err), structs.ErrNotFound) {
		c.logger.Debug("volume gone before its claim was released", "volume_id", volumeID, "alloc_id", alloc.ID)
		return nil
	}
	if err != nil {
		return fmt.Errorf("release claim on volume %q: %w", volumeID, err)
	}
	return nil
}
