package command

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/plugins/csi/hostpath"
)

func init() {
	register("plugin csi-hostpath", &Command{
		Synopsis: "Run the built-in hostpath CSI plugin",
		Run:      runPluginCSIHostpath,
	})
}

const pluginCSIHostpathUsage = `Usage: roam plugin csi-hostpath -endpoint unix:///PATH -node-id ID -state-dir DIR [options]

  Runs Roam's built-in CSI plugin, which simulates a storage provider with
  network disks kept in -state-dir. Plugin processes on one machine that share
  a state dir see the same volumes and data. Runs until SIGINT or SIGTERM, then
  stops accepting calls and lets in-flight calls finish; a second signal exits
  at once.

  For tests, a file named fault-hang-node-unpublish (or
  fault-hang-node-unpublish-NODE_ID) in -state-dir makes NodeUnpublishVolume
  hang until its caller gives up, or, if the file says "forever", until the
  file is removed; see the package documentation of plugins/csi/hostpath.

Options:
`

// pluginStopTimeout bounds the graceful stop; in-flight calls are bounded by
// the publish latency and their callers' deadlines, so this is generous.
const pluginStopTimeout = 2 * time.Minute

func runPluginCSIHostpath(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("plugin csi-hostpath", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, pluginCSIHostpathUsage)
		fs.PrintDefaults()
	}
	cfg := hostpath.DefaultConfig()
	var mode, logLevel string
	fs.StringVar(&cfg.Endpoint, "endpoint", "", "unix socket to serve on, as unix:///abs/path (required)")
	fs.StringVar(&cfg.NodeID, "node-id", "", "this node's ID (required)")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory for plugin state and volume data, shared by the plugins on this machine (required)")
	fs.StringVar(&cfg.TargetRoot, "target-root", "", "directory beneath which node staging and target paths must lie, such as a Roam client's <data_dir>/csi (default: any absolute path outside -state-dir)")
	fs.StringVar(&mode, "mode", string(cfg.Mode), "services to serve: controller, node or monolith")
	fs.DurationVar(&cfg.PublishLatency, "publish-latency", cfg.PublishLatency, "how long controller publish and unpublish take")
	fs.Int64Var(&cfg.MaxVolumesPerNode, "max-volumes-per-node", cfg.MaxVolumesPerNode, "volumes that may be attached to this node at once (0: no limit)")
	fs.StringVar(&cfg.Zone, "zone", "", "put this node in a zone (topology segment "+hostpath.TopologyZoneKey+"); volumes created with a topology requirement live in one zone")
	fs.BoolVar(&cfg.StrictSourceSize, "strict-source-size", false, "refuse a create from a snapshot or volume that asks for fewer bytes than its source, as most real providers do")
	fs.StringVar(&logLevel, "log-level", "INFO", "log level: TRACE, DEBUG, INFO, WARN, ERROR")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "roam plugin csi-hostpath: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 1
	}
	level := hclog.LevelFromString(logLevel)
	if level == hclog.NoLevel {
		fmt.Fprintf(errOut, "roam plugin csi-hostpath: invalid log level %q\n", logLevel)
		return 1
	}
	cfg.Mode = hostpath.Mode(mode)
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "roam", Level: level, Output: errOut})

	p, err := hostpath.New(cfg)
	if err != nil {
		fmt.Fprintf(errOut, "roam plugin csi-hostpath: %v\n", err)
		return 1
	}

	// Register for signals before serving so that none is missed.
	sigCh := make(chan os.Signal, 2)
	signal.Notify(sigCh, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigCh)

	if err := p.Start(); err != nil {
		fmt.Fprintf(errOut, "roam plugin csi-hostpath: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	fmt.Fprintf(out, "==> CSI plugin %s (%s, node %s) serving on %s\n", hostpath.PluginName, cfg.Mode, cfg.NodeID, p.Endpoint())

	select {
	case err := <-done:
		// The server stopped on its own.
		if err != nil {
			fmt.Fprintf(errOut, "roam plugin csi-hostpath: %v\n", err)
		}
		return 1
	case sig := <-sigCh:
		fmt.Fprintf(out, "==> Caught %s, stopping after in-flight calls finish (send again to exit at once)\n", sig)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintf(errOut, "roam plugin csi-hostpath: stop: %v\n", err)
			return 1
		}
		return 0
	case sig := <-sigCh:
		fmt.Fprintf(errOut, "==> Caught second %s, exiting now\n", sig)
		return 1
	case <-time.After(pluginStopTimeout):
		fmt.Fprintf(errOut, "roam plugin csi-hostpath: stop took over %s, exiting\n", pluginStopTimeout)
		return 1
	}
}
