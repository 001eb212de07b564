package hostpath

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Mode selects which CSI services a plugin process serves. The identity
// service is always served.
type Mode string

const (
	// ModeController serves identity and controller.
	ModeController Mode = "controller"
	// ModeNode serves identity and node.
	ModeNode Mode = "node"
	// ModeMonolith serves identity, controller and node.
	ModeMonolith Mode = "monolith"
)

// servesController reports whether the mode includes the controller service.
func (m Mode) servesController() bool { return m == ModeController || m == ModeMonolith }

// servesNode reports whether the mode includes the node service.
func (m Mode) servesNode() bool { return m == ModeNode || m == ModeMonolith }

// Config configures a Plugin. Endpoint, NodeID and StateDir have no useful
// defaults and must be set.
type Config struct {
	// Endpoint is the unix socket to serve on, as unix:///abs/path (the form
	// CSI plugins take on the command line), unix:/abs/path, or /abs/path.
	Endpoint string

	// NodeID names this plugin instance's node. It is reported by
	// NodeGetInfo, used as the node's key in the shared state, and names the
	// overlap and calls files. Letters, digits, '.', '_' and '-' only.
	NodeID string

	// StateDir holds the shared state file, volume data and snapshot data.
	// Every plugin process on a machine that should see the same "network
	// disks" uses the same StateDir.
	StateDir string

	// Mode selects the services served. Defaults to ModeMonolith.
	Mode Mode

	// TargetRoot, when set, is the directory beneath which the CO keeps
	// staging and target paths (a Roam client's <data_dir>/csi): node
	// calls with a path anywhere else fail with INVALID_ARGUMENT, and
	// publish and unpublish act through an os.Root on it, so no link on
	// the way leads out. Empty accepts any absolute path outside StateDir.
	TargetRoot string

	// PublishLatency is how long ControllerPublishVolume and
	// ControllerUnpublishVolume take before they act, like a cloud attach
	// or detach call. Zero means no delay.
	PublishLatency time.Duration

	// MaxVolumesPerNode is the size of this node's device pool: the number of
	// volumes that may be attached to it at once. It is reported by
	// NodeGetInfo. Zero means no limit.
	MaxVolumesPerNode int64
	// Zone, when set, puts this node in a zone: NodeGetInfo reports the
	// topology {TopologyZoneKey: Zone}, the plugin advertises
	// VOLUME_ACCESSIBILITY_CONSTRAINTS, and a volume created with a
	// topology requirement lives in one zone, attachable only from there.
	Zone string

	// StrictSourceSize refuses, with OUT_OF_RANGE, a create from a
	// snapshot or a volume that asks for fewer bytes than its source holds
	// (an unset capacity range asks for none), as most real providers do:
	// the Kubernetes hostpath driver answers "snapshot ... size ... is
	// greater than requested volume size 0". Unset, such a create grows to
	// fit its source, as the CSI spec also allows.
	StrictSourceSize bool

	// Logger receives the plugin's logs. Nil discards them.
	Logger hclog.Logger
}

// DefaultConfig returns a monolith configuration with a 16-device pool and
// no publish latency. The caller fills in Endpoint, NodeID and StateDir.
func DefaultConfig() *Config {
	return &Config{
		Mode:              ModeMonolith,
		MaxVolumesPerNode: 16,
	}
}

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("invalid hostpath plugin config")

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Validate reports the first problem with c, naming the bad value. It
// changes nothing.
func (c *Config) Validate() error {
	if c == nil {
		return fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if _, err := socketPath(c.Endpoint); err != nil {
		return fmt.Errorf("%w: endpoint %q: %w", ErrInvalidConfig, c.Endpoint, err)
	}
	if !nodeIDPattern.MatchString(c.NodeID) || len(c.NodeID) > 128 {
		return fmt.Errorf("%w: node ID %q: want 1-128 letters, digits, '.', '_' or '-'", ErrInvalidConfig, c.NodeID)
	}
	if c.StateDir == "" {
		return fmt.Errorf("%w: state dir is empty", ErrInvalidConfig)
	}
	if c.TargetRoot != "" && !filepath.IsAbs(c.TargetRoot) {
		return fmt.Errorf("%w: target root %q is not absolute", ErrInvalidConfig, c.TargetRoot)
	}
	switch c.Mode {
	case ModeController, ModeNode, ModeMonolith:
	default:
		return fmt.Errorf("%w: mode %q: want controller, node or monolith", ErrInvalidConfig, c.Mode)
	}
	if c.PublishLatency < 0 {
		return fmt.Errorf("%w: publish latency %s is negative", ErrInvalidConfig, c.PublishLatency)
	}
	if len(c.Zone) > 63 || strings.ContainsAny(c.Zone, "\x00\n") {
		return fmt.Errorf("%w: zone %.70q must be at most 63 bytes on one line", ErrInvalidConfig, c.Zone)
	}
	if c.MaxVolumesPerNode < 0 {
		return fmt.Errorf("%w: max volumes per node %d is negative", ErrInvalidConfig, c.MaxVolumesPerNode)
	}
	return nil
}

// socketPath turns an endpoint into the absolute path of its unix socket.
func socketPath(endpoint string) (string, error) {
	path := endpoint
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		path = strings.TrimPrefix(endpoint, "unix://")
	case strings.HasPrefix(endpoint, "unix:"):
		path = strings.TrimPrefix(endpoint, "unix:")
	case strings.Contains(endpoint, "://"):
		return "", errors.New("only unix sockets are supported")
	}
	if path == "" {
		return "", errors.New("no socket path")
	}
	if !filepath.IsAbs(path) {
		return "", errors.New("socket path must be absolute")
	}
	return filepath.Clean(path), nil
}
