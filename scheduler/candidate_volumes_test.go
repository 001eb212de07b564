package scheduler

import (
	"fmt"
	"testing"

	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// positionVolumes is rejectVolumes that the scheduler can also ask by
// position, through ForNodes; asked counts the questions asked that way.
type positionVolumes struct {
	reject rejectVolumes
	asked  *int
}

func (p positionVolumes) FeasibleVolumes(n *structs.Node, tg *structs.TaskGroup, idx int, replacing *structs.Allocation) (bool, string) {
	return p.reject.FeasibleVolumes(n, tg, idx, replacing)
}

func (p positionVolumes) ForNodes(nodes []*structs.Node) NodeVolumeChecker {
	return positionVolumesAt{p: p, nodes: nodes}
}

type positionVolumesAt struct {
	p     positionVolumes
	nodes []*structs.Node
}

func (a positionVolumesAt) FeasibleVolumesAt(i int, tg *structs.TaskGroup, idx int, replacing *structs.Allocation) (bool, string) {
	*a.p.asked++
	return a.p.reject.FeasibleVolumes(a.nodes[i], tg, idx, replacing)
}

// A CandidateVolumeChecker is asked about each candidate by its position
// in the list it was given: the plan and the failure metrics are those of
// the same checker asked node by node.
func TestProcess_CandidateVolumeCheckerSamePlan(t *testing.T) {
	for _, rejected := range [][]string{
		nil,
		{"node-00", "node-02", "node-07", "node-13", "node-19"},
		// All but two: placements fail and their metrics count.
		{"node-00", "node-01", "node-02", "node-03", "node-05", "node-06", "node-07", "node-08", "node-09",
			"node-10", "node-11", "node-12", "node-13", "node-14", "node-15", "node-16", "node-17", "node-18"},
	} {
		t.Run(fmt.Sprintf("%d rejected", len(rejected)), func(t *testing.T) {
			reject := rejectVolumes{}
			for _, id := range rejected {
				reject[id] = true
			}
			process := func(v VolumeChecker) (*structs.Plan, *Result) {
				st, job := busyCluster()
				plan, res, err := Process(st, mkEval(job), Options{Now: testNow, NewID: idSeq("id"), Volumes: v})
				must.NoError(t, err)
				return plan, res
			}
			plan1, res1 := process(reject)
			asked := 0
			plan2, res2 := process(positionVolumes{reject: reject, asked: &asked})
			must.Positive(t, asked)
			must.Eq(t, plan1, plan2)
			must.Eq(t, res1, res2)
			if len(rejected) > 10 {
				must.MapNotEmpty(t, res1.FailedTGAllocs)
			}
		})
	}
}
