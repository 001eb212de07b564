package command

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/sim"
)

func init() {
	register("sim", &Command{Synopsis: "Run simulated client nodes against servers (scale tests)", Run: runSim})
}

const simUsage = `Usage: roam sim -servers ADDR[,ADDR...] [options]

  Runs simulated client nodes in this process against real servers: each
  registers, heartbeats, runs its allocations (without tasks) and claims
  their volumes over the client RPC, and answers the servers' controller
  calls with an in-process fake plugin. With -volumes-per-node it registers
  that many volumes per node and a job whose allocations claim
  -claimed-per-node of them per node. It prints its counts as JSON every
  -report-every until interrupted.
`

func runSim(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() { fmt.Fprint(errOut, simUsage); fs.PrintDefaults() }
	def := sim.DefaultConfig(nil)
	servers := fs.String("servers", "", "comma-separated server RPC addresses")
	nodes := fs.Int("nodes", def.Nodes, "simulated nodes")
	controllers := fs.Int("controllers", def.Controllers, "nodes that run the plugin's controller")
	plugin := fs.String("plugin", def.PluginID, "CSI plugin ID")
	perNode := fs.Int("volumes-per-node", 0, "volumes to register per node (0: none, and no job)")
	claimedPerNode := fs.Int("claimed-per-node", 0, "claimed volumes per node (at most -allocs-per-node)")
	allocsPerNode := fs.Int("allocs-per-node", def.AllocsPerNode, "allocations of the job a node has room for")
	token := fs.String("token", os.Getenv("NOMAD_TOKEN"), "ACL token for volume and job registration")
	intro := fs.String("intro-token", "", "client intro token, if the servers require one")
	latency := fs.Duration("provider-latency", def.ProviderLatency, "time each fake provider call takes")
	every := fs.Duration("report-every", 10*time.Second, "how often to print counts")
	logLevel := fs.String("log-level", "WARN", "log level")
	if err := fs.Parse(args); err != nil {
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "roam sim: unexpected arguments %q\n", fs.Args())
		return 1
	}
	switch {
	case *servers == "":
		fmt.Fprintln(errOut, "roam sim: -servers is required")
		return 1
	case *perNode < 0 || *perNode > 64:
		fmt.Fprintf(errOut, "roam sim: -volumes-per-node = %d, must be 0 to 64\n", *perNode)
		return 1
	case *claimedPerNode < 0 || *claimedPerNode > *allocsPerNode || *claimedPerNode > *perNode:
		fmt.Fprintf(errOut, "roam sim: -claimed-per-node = %d, must be 0 to -allocs-per-node and at most -volumes-per-node\n", *claimedPerNode)
		return 1
	case *every <= 0:
		fmt.Fprintf(errOut, "roam sim: -report-every = %s, must be positive\n", *every)
		return 1
	}
	cfg := sim.DefaultConfig(strings.Split(*servers, ","))
	cfg.Nodes, cfg.Controllers, cfg.PluginID, cfg.AllocsPerNode = *nodes, *controllers, *plugin, *allocsPerNode
	cfg.Token, cfg.IntroToken, cfg.ProviderLatency = *token, *intro, *latency
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "roam", Level: hclog.LevelFromString(*logLevel), Output: errOut})
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(errOut, "roam sim: %v\n", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := sim.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintf(errOut, "roam sim: %v\n", err)
		return 1
	}
	defer s.Stop()
	if *perNode > 0 {
		claimed := *nodes * *claimedPerNode
		ids := sim.VolumeIDs(0, claimed, 0, *nodes**perNode-claimed)
		if err := s.RegisterVolumes(ctx, ids, 200); err != nil {
			fmt.Fprintf(errOut, "roam sim: %v\n", err)
			return 1
		}
		if claimed > 0 {
			if err := s.RegisterJob(ctx, claimed); err != nil {
				fmt.Fprintf(errOut, "roam sim: %v\n", err)
				return 1
			}
		}
	}
	enc := json.NewEncoder(out)
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for {
		if err := enc.Encode(s.Counts()); err != nil {
			return 1
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}
