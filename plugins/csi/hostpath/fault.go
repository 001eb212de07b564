package hostpath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FaultHangNodeUnpublish names the fault file that makes NodeUnpublishVolume
// hang (see the package documentation). It lives in the state dir, alone to
// hang every instance sharing the dir, or with "-<node-id>" appended to hang
// one instance only.
const FaultHangNodeUnpublish = "fault-hang-node-unpublish"

// FaultHangControllerPublish names the fault file that makes
// ControllerPublishVolume hang once its latency has passed, with the call
// counted in flight at the provider, as a provider API call stuck on its
// far side. Placed like FaultHangNodeUnpublish.
const FaultHangControllerPublish = "fault-hang-controller-publish"

// FaultHangControllerUnpublish is FaultHangControllerPublish for
// ControllerUnpublishVolume.
const FaultHangControllerUnpublish = "fault-hang-controller-unpublish"

// Contents of a hang fault file: how a hung call ends besides the fault
// being switched off or the plugin stopping.
const (
	// FaultUntilCancel (or an empty file) ends the hang when the caller
	// gives up: its gRPC context ends.
	FaultUntilCancel = "until-cancel"
	// FaultForever ignores the caller: the call hangs until the fault is
	// switched off or the plugin stops, as a plugin stuck in the kernel.
	FaultForever = "forever"
)

// faultPollInterval is how often a hung call looks whether its fault was
// switched off.
const faultPollInterval = 50 * time.Millisecond

// faultFile returns the path and contents of the fault file name that
// applies to this instance, its own before the shared one; ok is false when
// neither exists. An unreadable or unknown file counts as FaultUntilCancel:
// a fault that is on must not be missed.
func (p *Plugin) faultFile(name string) (path, mode string, ok bool) {
	for _, f := range []string{name + "-" + p.cfg.NodeID, name} {
		path := filepath.Join(p.cfg.StateDir, f)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil && strings.TrimSpace(string(b)) == FaultForever {
			return path, FaultForever, true
		}
		return path, FaultUntilCancel, true
	}
	return "", "", false
}

// hangIfFaulted blocks while the fault file name is there for this
// instance. It returns nil once the fault is switched off (the call then
// goes on as usual), and a DEADLINE_EXCEEDED or CANCELLED status when the
// caller gives up first (unless the file says FaultForever) or UNAVAILABLE
// when the plugin stops; either way the call changed nothing.
func (p *Plugin) hangIfFaulted(ctx context.Context, name, method string, keyvals ...any) error {
	path, mode, ok := p.faultFile(name)
	if !ok {
		return nil
	}
	start := time.Now()
	p.logger.Warn("fault injected: call hangs", append([]any{"method", method, "fault_file", path, "until", mode}, keyvals...)...)
	done := ctx.Done()
	if mode == FaultForever {
		done = nil
	}
	t := time.NewTicker(faultPollInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			p.logger.Warn("fault injected: hung call ended by its caller",
				append([]any{"method", method, "hung_for", time.Since(start), "error", ctx.Err()}, keyvals...)...)
			return status.FromContextError(ctx.Err()).Err()
		case <-p.quit:
			p.logger.Warn("fault injected: hung call ended by the plugin stopping",
				append([]any{"method", method, "hung_for", time.Since(start)}, keyvals...)...)
			return status.Error(codes.Unavailable, "plugin stopping")
		case <-t.C:
		}
		if _, _, ok := p.faultFile(name); !ok {
			p.logger.Warn("fault injected: fault switched off; hung call goes on",
				append([]any{"method", method, "hung_for", time.Since(start)}, keyvals...)...)
			return nil
		}
	}
}

// SetFault switches the fault file name on (with mode as its contents) or
// off (mode ""), for every instance sharing stateDir when nodeID is empty,
// else for that instance only. Tests use it; an operator may as well
// write or remove the file by hand.
func SetFault(stateDir, nodeID, name, mode string) error {
	f := name
	if nodeID != "" {
		f += "-" + nodeID
	}
	path := filepath.Join(stateDir, f)
	if mode == "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("switching fault %s off: %w", f, err)
		}
		return nil
	}
	if mode != FaultUntilCancel && mode != FaultForever {
		return fmt.Errorf("fault %s: mode %q: want %q or %q", f, mode, FaultUntilCancel, FaultForever)
	}
	if err := os.WriteFile(path, []byte(mode+"\n"), 0o644); err != nil {
		return fmt.Errorf("switching fault %s on: %w", f, err)
	}
	return nil
}
