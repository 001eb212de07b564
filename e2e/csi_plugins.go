//go:build e2e

package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The hostpath plugin instances of a csiCluster. By default each plugin ID
// is a Roam system job whose task has a csi_plugin block, as an operator
// would run it: the client starts the plugin, hands it its socket in
// CSI_ENDPOINT and fingerprints it. With csiOpts.ExternalPlugins the test
// starts one plugin process per client itself and names its socket in the
// client's config (client { csi_plugin "ID" { socket = ... } }).

// csiPluginJobID is the ID of the system job that runs plugin pluginID.
func csiPluginJobID(pluginID string) string { return "csi-" + pluginID }

// csiPluginScript starts the built-in plugin from a raw_exec task. raw_exec
// does not expand variables in args, so a shell passes the client-chosen
// $CSI_ENDPOINT and the node's name on; the binary is $0 and the remaining
// flags are positional parameters, free of quoting. exec keeps the plugin
// the task's process, so signals and the command line are the plugin's.
const csiPluginScript = `exec "$0" plugin csi-hostpath -endpoint "$CSI_ENDPOINT" -node-id "$ROAM_NODE_NAME" "$@"`

// csiPluginFlags are the plugin's flags other than its endpoint and node
// ID, the same in both modes.
func csiPluginFlags(stateDir string, opts csiOpts) []string {
	args := []string{
		"-state-dir", stateDir,
		"-mode", "monolith",
		"-publish-latency", opts.PublishLatency.String(),
	}
	if opts.MaxVolumesPerNode > 0 {
		args = append(args, "-max-volumes-per-node", strconv.Itoa(opts.MaxVolumesPerNode))
	}
	return args
}

// csiPluginJob is the jobspec of the system job that runs plugin pluginID
// on every client, with its volumes' data in stateDir. The task is named
// after the plugin so that its log files (alloc/logs/<task>.stderr.0) tell
// the plugins apart.
func csiPluginJob(roam, pluginID, stateDir string, opts csiOpts) string {
	args := append([]string{"-c", csiPluginScript, roam}, csiPluginFlags(stateDir, opts)...)
	return fmt.Sprintf(`job %q {
  type        = "system"
  datacenters = ["dc1"]

  group "plugin" {
    task %q {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = %s
      }
      csi_plugin {
        id        = %q
        type      = "monolith"
        mount_dir = "csi"
      }
      kill_signal  = "SIGTERM"
      kill_timeout = "10s"
      resources {
        cpu    = 20
        memory = 32
      }
    }
%s  }
}
`, csiPluginJobID(pluginID), pluginID, hclList(args), pluginID, opts.PluginGroupExtra)
}

// csiPluginProc is the plugin instance of one plugin ID on one client. Its
// methods mirror Agent's so that a test reads the same in both modes: in
// external mode they act on the process the test started; in job mode on
// the client's plugin task, found by its command line (the task's process
// is the plugin itself, and it outlives a stopped or killed client).
type csiPluginProc struct {
	// PluginID and Client name the instance; Client is also its node ID
	// at the plugin (-node-id), which keys its call and overlap records.
	PluginID string
	Client   string
	// StateDir is the state directory the plugin ID's instances share.
	StateDir string
	// Socket is where the instance listens.
	Socket string

	// agent is the process in external mode; nil in job mode.
	agent *Agent
	// dataDir is the client's data dir (job mode): the task's logs live
	// under it.
	dataDir string

	mu       sync.Mutex
	signaled int // pid last signaled in job mode
}

// Name describes the instance in messages.
func (p *csiPluginProc) Name() string {
	return fmt.Sprintf("plugin %s of %s", p.PluginID, p.Client)
}

// External reports whether the test started the process itself.
func (p *csiPluginProc) External() bool { return p.agent != nil }

// PID returns the pid of the running plugin, 0 if none runs.
func (p *csiPluginProc) PID() int {
	if p.agent != nil {
		p.agent.mu.Lock()
		defer p.agent.mu.Unlock()
		if !p.agent.running {
			return 0
		}
		return p.agent.proc.Pid
	}
	pid, _ := p.find()
	return pid
}

// Running reports whether the plugin process is alive.
func (p *csiPluginProc) Running() bool {
	if p.agent != nil {
		return p.agent.Running()
	}
	return p.PID() > 0
}

// Signal sends sig to the plugin process.
func (p *csiPluginProc) Signal(sig syscall.Signal) error {
	if p.agent != nil {
		return p.agent.Signal(sig)
	}
	pid, _ := p.find()
	if pid == 0 {
		return fmt.Errorf("%s: no process running", p.Name())
	}
	p.mu.Lock()
	p.signaled = pid
	p.mu.Unlock()
	return syscall.Kill(pid, sig)
}

// Wait waits up to timeout for the process last signaled to exit. In job
// mode the task's executor reaps it, so the exit code is unknown: -1.
func (p *csiPluginProc) Wait(timeout time.Duration) (int, error) {
	if p.agent != nil {
		return p.agent.Wait(timeout)
	}
	p.mu.Lock()
	pid := p.signaled
	p.mu.Unlock()
	if pid == 0 {
		return 0, fmt.Errorf("%s: no process was signaled", p.Name())
	}
	err := poll(timeout, func() error {
		if pidAlive(pid) {
			return fmt.Errorf("%s: pid %d still running after %s", p.Name(), pid, timeout)
		}
		return nil
	})
	return -1, err
}

// logFiles are the task's log files in job mode, oldest allocation first:
// a replaced plugin allocation leaves its logs behind.
func (p *csiPluginProc) logFiles() []string {
	var files []string
	for _, stream := range []string{"stderr", "stdout"} {
		m, _ := filepath.Glob(filepath.Join(p.dataDir, "alloc", "*", "alloc", "logs", p.PluginID+"."+stream+".0"))
		files = append(files, m...)
	}
	mtime := func(f string) time.Time {
		st, err := os.Stat(f)
		if err != nil {
			return time.Time{}
		}
		return st.ModTime()
	}
	sort.SliceStable(files, func(i, j int) bool { return mtime(files[i]).Before(mtime(files[j])) })
	return files
}

// Log returns the plugin's whole log: in job mode the task's stderr and
// stdout, as `roam alloc logs` would serve them, but read from the
// client's data dir so that it is there while the client is down.
func (p *csiPluginProc) Log() string {
	if p.agent != nil {
		return p.agent.Log()
	}
	var b strings.Builder
	for _, f := range p.logFiles() {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "(%s: %v)\n", f, err)
			continue
		}
		b.Write(data)
	}
	if b.Len() == 0 {
		return fmt.Sprintf("(no log of %s under %s)", p.Name(), p.dataDir)
	}
	return b.String()
}

// LogTail returns the last n lines of the plugin's log.
func (p *csiPluginProc) LogTail(n int) string {
	if p.agent != nil {
		return p.agent.LogTail(n)
	}
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// find scans /proc for the live plugin process serving p: argv is
// "<roam> plugin csi-hostpath ... -node-id <client> ... -state-dir <dir>".
// It returns the pid and the socket of its -endpoint, or 0 if none runs.
// The shell that starts it does not match: its argv[1] is -c.
func (p *csiPluginProc) find() (int, string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, ""
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(raw, []byte("csi-hostpath")) {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(argv) < 3 || argv[1] != "plugin" || argv[2] != "csi-hostpath" {
			continue
		}
		if flagValue(argv, "-node-id") != p.Client || flagValue(argv, "-state-dir") != p.StateDir {
			continue
		}
		if !pidAlive(pid) {
			continue
		}
		return pid, strings.TrimPrefix(flagValue(argv, "-endpoint"), "unix://")
	}
	return 0, ""
}

// flagValue returns the argument after flag in argv, "" if none.
func flagValue(argv []string, flag string) string {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == flag {
			return argv[i+1]
		}
	}
	return ""
}

// waitTask waits until the plugin task runs and answers on its socket, and
// records the socket.
func (p *csiPluginProc) waitTask(timeout time.Duration) error {
	return poll(timeout, func() error {
		pid, sock := p.find()
		if pid == 0 {
			return fmt.Errorf("%s: no process yet; its log:\n%s", p.Name(), p.LogTail(20))
		}
		if sock == "" {
			return errors.New(p.Name() + ": process has no -endpoint")
		}
		if err := probePlugin(sock); err != nil {
			return fmt.Errorf("%s (pid %d): %w", p.Name(), pid, err)
		}
		p.Socket = sock
		return nil
	})
}
