//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestCSI_TopologyPlacesOnlyInZone: with clients in zones a, b and a, a
// volume created with required topology zone b is only ever placed on
// the zone b client. With that client ineligible, the evaluation blocks
// with a reason naming the topology, and the allocation is placed once
// the client is eligible again.
func TestCSI_TopologyPlacesOnlyInZone(t *testing.T) {
	const zoneKey = "topology.hostpath.csi/zone"
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 3, ExternalPlugins: true,
		Zones: map[string]string{"client-0": "a", "client-1": "b", "client-2": "a"}})
	zoneB := cc.NodeIDs["client-1"]
	// Each node's plugin reports its zone, fingerprinted per node.
	for name, zone := range map[string]string{"client-0": "a", "client-1": "b", "client-2": "a"} {
		out := cc.MustCLI("node", "status", "-verbose", cc.NodeIDs[name])
		must.True(t, hasRow(out, csiPluginID, "true", zoneKey+"="+zone), must.Sprintf("%s:\n%s", name, out))
	}

	spec := createVolumeSpec("zonal", "1MiB", fmt.Sprintf(`topology_request {
  required {
    topology {
      segments = {
        %q = "b"
      }
    }
  }
}`, zoneKey))
	cc.createVolumeCLI(t, "zonal", spec)
	v, err := cc.volume("zonal")
	must.NoError(t, err)
	must.SliceLen(t, 1, v.Topologies)
	must.Eq(t, map[string]string{zoneKey: "b"}, v.Topologies[0].Segments)

	// Placed three times over (a fresh allocation each time): always on
	// the zone b client.
	for i := range 3 {
		job := fmt.Sprintf("zonal-%d", i)
		cc.RunJob(csiJob(job, "batch", 1, "zonal", false, "", `echo ok`))
		a := cc.waitCSIAllocs(t, job, csiSettle, oneAlloc("complete"))[0]
		must.EqOp(t, zoneB, a.NodeID, must.Sprintf("%s placed on %s", job, a.NodeName))
		cc.waitUnclaimed(t, "zonal")
	}

	// With zone b closed, the placement blocks and says why.
	cc.SetEligible(zoneB, false)
	cc.RunJob(csiJob("zonal-blocked", "service", 1, "zonal", false, "", `while :; do sleep 1; done`))
	WaitFor(t, csiSettle, func() error {
		evals, err := JobEvals(cc.API(), "zonal-blocked")
		if err != nil {
			return err
		}
		for _, e := range evals {
			for _, m := range e.FailedTGAllocs {
				for reason := range m.ConstraintFiltered {
					if strings.Contains(reason, "accessible only in topology {"+zoneKey+"=b}") {
						return nil
					}
				}
			}
		}
		return fmt.Errorf("no evaluation names the topology yet: %d evals", len(evals))
	})
	list, err := JobAllocs(cc.API(), "zonal-blocked")
	must.NoError(t, err)
	must.SliceEmpty(t, live(list), must.Sprint("placed outside zone b"))

	cc.SetEligible(zoneB, true)
	a := cc.waitCSIAllocs(t, "zonal-blocked", csiSettle, oneAlloc("running"))[0]
	must.EqOp(t, zoneB, a.NodeID)
	cc.waitClaim(t, "zonal", a.ID)
	cc.mustNoOverlaps(t)
}
