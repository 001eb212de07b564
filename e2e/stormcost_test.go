//go:build e2e && storm

package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// TestStormCostByKind is a diagnostic, not an acceptance test: on 3
// servers it runs each kind of the storm's traffic alone, in windows
// alternating with quiet ones, and reports the CPU the servers spent per
// second of it beyond their quiet rate, next to the generator's own. CPU
// time, unlike latency, is little moved by what else runs on the
// machine, so the kinds can be ranked by what they cost the agents on a
// shared host. It fails only if a server dies or a kind sent nothing.
//
//	go test -tags 'e2e storm' -count=1 -v -run '^TestStormCostByKind$' ./e2e/
//
// ROAM_STORM_COST_KINDS (comma-separated) runs only those kinds, and
// ROAM_STORM_COST_ROUNDS sets the rounds of each (default 2), for a
// longer look at one kind (with perf on a server, say).
func TestStormCostByKind(t *testing.T) {
	const window = 5 * time.Second
	rounds := 2 // of quiet then stormy, per kind
	if n, err := strconv.Atoi(os.Getenv("ROAM_STORM_COST_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	c := StartCluster(t, Opts{Servers: 3, ServerConfigExtra: biLimits, LogLevel: "INFO"})
	c.Leader()
	guardMemory(t, memGuardCap, c.Servers...)
	var tg stormTargets
	for _, a := range c.Servers {
		tg.RPCAddrs = append(tg.RPCAddrs, a.RPCAddr())
		tg.HTTPAddrs = append(tg.HTTPAddrs, strings.TrimPrefix(a.HTTPAddr(), "http://"))
		tg.HTTPBases = append(tg.HTTPBases, a.HTTPAddr())
	}
	gen := startStormProc(t, tg)
	must.NoError(t, gen.warm())

	kinds := []string{"junk", "partial-rpc", "partial-raft", "slow-body", "blocking", "nested-hcl", "groups-json", "groups-rpc", "huge-count"}
	if only := os.Getenv("ROAM_STORM_COST_KINDS"); only != "" {
		kinds = strings.Split(only, ",")
	}
	for _, s := range c.Servers {
		t.Logf("%s: pid %d", s.Name, s.PID())
	}
	var lines []string
	for _, kind := range kinds {
		before, err := gen.report()
		must.NoError(t, err)
		var quietCPU, stormCPU, genCPU, quietSpan, stormSpan time.Duration
		for range rounds {
			a0, t0 := agentsCPU(c.Servers), time.Now()
			watchAgents(window, c.Servers...) // the quiet window, cut short if a server exits
			quietCPU += agentsCPU(c.Servers) - a0
			quietSpan += time.Since(t0)

			a0, g0, t0 := agentsCPU(c.Servers), gen.cpu(), time.Now()
			must.NoError(t, gen.run(window, kind))
			stormCPU += agentsCPU(c.Servers) - a0
			genCPU += gen.cpu() - g0
			stormSpan += time.Since(t0)
		}
		after, err := gen.report()
		must.NoError(t, err)
		var sent []string
		total := 0
		for k, n := range after.Counts {
			if d := n - before.Counts[k]; d > 0 && strings.HasPrefix(k, kind) {
				sent = append(sent, fmt.Sprintf("%s %.1f/s", k, float64(d)/stormSpan.Seconds()))
				total += d
			}
		}
		must.Positive(t, total, must.Sprintf("%s sent nothing", kind))
		quiet, stormy := quietCPU.Seconds()/quietSpan.Seconds(), stormCPU.Seconds()/stormSpan.Seconds()
		line := fmt.Sprintf("%-13s servers %.3f cores (quiet %.3f, +%.3f), generator %.3f cores; %s",
			kind, stormy, quiet, stormy-quiet, genCPU.Seconds()/stormSpan.Seconds(), strings.Join(sent, ", "))
		t.Log(line)
		lines = append(lines, line)
		for _, s := range c.Servers {
			must.True(t, s.Running(), must.Sprintf("%s died under %s: %s", s.Name, kind, s.ExitState()))
		}
	}
	t.Logf("servers' CPU by kind of storm traffic:\n%s", strings.Join(lines, "\n"))
}
