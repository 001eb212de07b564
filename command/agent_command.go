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

	"github.com/roamhq/roam/command/agent"
)

func init() {
	register("agent", &Command{Synopsis: "Run a Roam agent (server, client, or both)", Run: runAgent})
}

// stringList is a repeatable flag; each use may also hold a comma list.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*s = append(*s, part)
		}
	}
	return nil
}

const agentUsage = `Usage: roam agent [options]

  Starts a Roam agent. With -dev, runs a server and a client in one process
  with in-memory Raft and a temporary data dir.

Options:
`

func runAgent(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, agentUsage)
		fs.PrintDefaults()
	}
	var (
		configs, retryJoin, servers                        stringList
		dev, server, clientOn                              bool
		bootstrapExpect, httpPort, rpcPort                 int
		dataDir, bind, node, dc, region, logLevel, rpcAddr string
	)
	fs.Var(&configs, "config", "HCL config file (repeatable; later files override earlier ones)")
	fs.BoolVar(&dev, "dev", false, "run server and client in one process with in-memory state")
	fs.BoolVar(&server, "server", false, "enable the server")
	fs.BoolVar(&clientOn, "client", false, "enable the client")
	fs.IntVar(&bootstrapExpect, "bootstrap-expect", 0, "servers to wait for before bootstrapping")
	fs.StringVar(&dataDir, "data-dir", "", "directory for agent state")
	fs.StringVar(&bind, "bind", "", "address to bind listeners to")
	fs.Var(&retryJoin, "retry-join", "server RPC address to join (repeatable)")
	fs.Var(&servers, "servers", "server RPC addresses for the client (repeatable, or comma-separated)")
	fs.StringVar(&node, "node", "", "agent name")
	fs.StringVar(&dc, "dc", "", "datacenter")
	fs.StringVar(&region, "region", "", "region")
	fs.StringVar(&logLevel, "log-level", "", "log level: TRACE, DEBUG, INFO, WARN, ERROR")
	fs.IntVar(&httpPort, "http-port", 0, "HTTP API port")
	fs.IntVar(&rpcPort, "rpc-port", 0, "RPC port")
	fs.StringVar(&rpcAddr, "rpc-advertise", "", "RPC address other agents should dial")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "roam agent: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 1
	}

	cfg := agent.DefaultConfig()
	if dev {
		cfg = agent.DevConfig()
		// The roam binary can serve the built-in plugin itself.
		cfg.DevCSIPlugin = true
	}
	for _, path := range configs {
		fc, err := agent.LoadConfigFile(path)
		if err != nil {
			fmt.Fprintf(errOut, "roam agent: invalid config file %s:\n%v\n", path, err)
			return 1
		}
		cfg = cfg.Merge(fc)
	}
	flags := &agent.Config{
		DataDir:    dataDir,
		BindAddr:   bind,
		Name:       node,
		Region:     region,
		Datacenter: dc,
		LogLevel:   logLevel,
		Ports:      &agent.Ports{HTTP: httpPort, RPC: rpcPort},
		Advertise:  &agent.Advertise{RPC: rpcAddr},
		Server: &agent.ServerConfig{
			Enabled:         server,
			BootstrapExpect: bootstrapExpect,
			ServerJoin:      &agent.ServerJoin{RetryJoin: retryJoin},
		},
		Client: &agent.ClientConfig{Enabled: clientOn, Servers: servers},
	}
	cfg = cfg.Merge(flags)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(errOut, "roam agent: %v\n", err)
		return 1
	}

	a, err := agent.NewAgent(cfg, errOut)
	if err != nil {
		fmt.Fprintf(errOut, "roam agent: %v\n", err)
		return 1
	}
	fmt.Fprintf(out, "==> Roam agent started. HTTP API: %s://%s\n", a.HTTPScheme(), a.HTTPAddr())
	if dev {
		fmt.Fprintf(out, "==> Dev mode: try `curl %s://%s/v1/status/leader` or `roam node status`\n", a.HTTPScheme(), a.HTTPAddr())
	}

	// SIGHUP reloads the TLS certificates. The first SIGINT or SIGTERM
	// shuts down cleanly; a second one exits at once.
	hupCh := make(chan os.Signal, 1)
	signal.Notify(hupCh, syscall.SIGHUP)
	sigCh := make(chan os.Signal, 2)
	signal.Notify(sigCh, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	var sig os.Signal
	for sig == nil && code == 0 {
		select {
		case <-hupCh:
			if err := a.ReloadTLS(); err != nil {
				fmt.Fprintf(errOut, "roam agent: reload: %v\n", err)
			} else {
				fmt.Fprintln(out, "==> Caught SIGHUP, reloaded TLS certificates")
			}
		case sig = <-sigCh:
			fmt.Fprintf(out, "==> Caught %s, shutting down (send again to exit at once)\n", sig)
		case err := <-a.Fatal():
			fmt.Fprintf(errOut, "roam agent: %v\n", err)
			code = 1
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintf(errOut, "roam agent: shutdown: %v\n", err)
			return 1
		}
		return code
	case sig := <-sigCh:
		fmt.Fprintf(errOut, "==> Caught second %s, exiting now\n", sig)
		return 1
	case <-time.After(5 * time.Minute):
		fmt.Fprintln(errOut, "roam agent: shutdown took over 5m, exiting")
		return 1
	}
}
