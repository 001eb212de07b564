package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/roamhq/roam/structs"
)

// JobID is the job RegisterJob registers: one group whose allocations each claim
// their own volume (per_alloc).
const JobID = "sim-scale"

// ClaimedVolume is the ID of the volume allocation index i claims.
func ClaimedVolume(i int) string { return fmt.Sprintf("%s[%d]", JobID, i) }

// FreeVolume is the ID of the i-th volume no allocation claims.
func FreeVolume(i int) string { return fmt.Sprintf("sim-free-%d", i) }

// VolumeIDs returns ClaimedVolume(i) for i in [claimedFrom, claimedTo)
// and FreeVolume(i) for i in [freeFrom, freeTo).
func VolumeIDs(claimedFrom, claimedTo, freeFrom, freeTo int) []string {
	var ids []string
	for i := claimedFrom; i < claimedTo; i++ {
		ids = append(ids, ClaimedVolume(i))
	}
	for i := freeFrom; i < freeTo; i++ {
		ids = append(ids, FreeVolume(i))
	}
	return ids
}

// operatorRPC makes one call as an operator (the configured token), on a
// session of its own, retrying what the client retries.
func (s *Sim) operatorRPC(ctx context.Context, method string, args, reply any) error {
	if a, ok := args.(interface{ SetAuth(region, token string) }); ok {
		a.SetAuth(s.cfg.Region, s.cfg.Token)
	}
	deadline := time.Now().Add(s.cfg.CallTimeout)
	var last error
	for i := 0; ; i++ {
		addr := s.cfg.Servers[i%len(s.cfg.Servers)]
		sess, err := dialSession(addr, "", 10*time.Second, nil, s.logger, &s.wg)
		dialFailed := err != nil // a server that is down: try the next one
		if err == nil {
			err = sess.call(ctx, method, args, reply, s.cfg.CallTimeout)
			sess.close()
		}
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil || time.Now().After(deadline) ||
			(!dialFailed && !retryable(err)) {
			return fmt.Errorf("sim: %s: %w", method, last)
		}
		if err := backoff(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// RegisterVolumes registers volumes of the plugin with the given IDs,
// batch of them per call.
func (s *Sim) RegisterVolumes(ctx context.Context, ids []string, batch int) error {
	if batch < 1 {
		return fmt.Errorf("sim: volume batch of %d: must be positive", batch)
	}
	for len(ids) > 0 {
		n := min(batch, len(ids))
		vols := make([]*structs.CSIVolume, 0, n)
		for _, id := range ids[:n] {
			vols = append(vols, &structs.CSIVolume{
				ID: id, Name: id, Namespace: structs.DefaultNamespace, PluginID: s.cfg.PluginID,
				ExternalID: "ext-" + id,
				RequestedCapabilities: []*structs.CSIVolumeCapability{{
					AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem}},
			})
		}
		var resp structs.CSIVolumeRegisterResponse
		if err := s.operatorRPC(ctx, "CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: vols}, &resp); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// allocCPU is the CPU (MHz) one allocation of the job asks for.
const allocCPU = 100

// RegisterJob registers the service job whose count allocations each
// claim one volume; a node fits Config.AllocsPerNode of them.
func (s *Sim) RegisterJob(ctx context.Context, count int) error {
	job := &structs.Job{
		Region: s.cfg.Region, Namespace: structs.DefaultNamespace, ID: JobID, Name: JobID,
		Type: structs.JobTypeService, Priority: 50, Datacenters: []string{s.cfg.Datacenter},
		TaskGroups: []*structs.TaskGroup{{
			Name: "g", Count: count,
			Volumes: map[string]*structs.VolumeRequest{"data": {
				Name: "data", Type: "csi", Source: JobID, PerAlloc: true,
				AccessMode: structs.CSIAccessModeSingleNodeWriter, AttachmentMode: structs.CSIAttachmentModeFilesystem,
			}},
			Tasks: []*structs.Task{{
				Name: "t", Driver: "raw_exec",
				Config:       map[string]any{"command": "/bin/true"},
				Resources:    &structs.Resources{CPU: allocCPU, MemoryMB: 64},
				VolumeMounts: []*structs.VolumeMount{{Volume: "data", Destination: "data"}},
			}},
		}},
	}
	var resp structs.JobRegisterResponse
	return s.operatorRPC(ctx, "Job.Register", &structs.JobRegisterRequest{Job: job}, &resp)
}

// WaitClaims waits until the live nodes hold want claims, or ctx ends.
func (s *Sim) WaitClaims(ctx context.Context, want int) error {
	for {
		c := s.Counts()
		if c.Claims == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sim: live nodes hold %d claims, want %d: %w", c.Claims, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
