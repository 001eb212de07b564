// Setting up the client's CSI side: the plugin manager, the volume
// manager, and the ClientCSI service the servers call.

package client

import (
	"fmt"
	"slices"
)

// setupCSI starts the CSI plugin manager with the configured plugins and
// registers the ClientCSI service servers call.
func (c *Client) setupCSI() error {
	term, err := c.db.leaderTerm()
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	c.csi = newCSIManager(csiManagerConfig{
		FingerprintInterval:   c.config.CSIFingerprintInterval,
		ControllerCallTimeout: c.config.CSIControllerCallTimeout,
		OnChange:              c.triggerNodeUpdate,
		Logger:                c.logger,
		LeaderTerm:            term,
		SaveTerm:              c.db.putLeaderTerm,
		Lease:                 c.controllerLease,
		Renew:                 c.renewLease,
	})
	// Volumes are claimed from the servers (CSIVolume.Claim), which
	// publish them at the controller, and released the same way.
	c.csiVolumes = newCSIVolumeManager(csiVolumeManagerConfig{
		DataDir: c.config.DataDir,
		Plugins: c.csi,
		Claim:   c.claimCSIVolume,
		Release: c.releaseCSIVolume,
		// Bounds the node plugin calls and the servers' NodeDetachVolume
		// requests: a hung plugin holds up only its own volumes.
		NodeCallTimeout: c.config.CSINodeCallTimeout,
		// What is mounted outlives a client restart: see csiVolumeManager.
		Store:  c.db,
		Logger: c.logger,
	})
	ids := make([]string, 0, len(c.config.CSIPlugins))
	for id := range c.config.CSIPlugins {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := c.csi.AddPlugin(c.config.CSIPlugins[id]); err != nil {
			_ = c.csi.shutdown(c.shutdownCtx)
			return fmt.Errorf("client: %w", err)
		}
	}
	if err := c.RegisterRPC("ClientCSI", &ClientCSI{mgr: c.csi, vols: c.csiVolumes}); err != nil {
		_ = c.csi.shutdown(c.shutdownCtx)
		return err
	}
	return nil
}
