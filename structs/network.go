package structs

import (
	"fmt"
	"strconv"
)

// Network modes a group may ask for. Only host networking exists: tasks
// share the node's network namespace and listen on the host ports the
// scheduler gives them.
const (
	NetworkModeHost   = "host"
	NetworkModeBridge = "bridge"
)

// Dynamic ports come from this range unless the client sets its own, as
// in Nomad.
const (
	DefaultMinDynamicPort = 20000
	DefaultMaxDynamicPort = 32000
)

// MaxGroupPorts bounds the ports of one group.
const MaxGroupPorts = 64

// maxPortLabel bounds a port label, which becomes part of variable names.
const maxPortLabel = 64

// NetworkResource is a group's network block, in Nomad's shape:
// ReservedPorts are static, DynamicPorts are picked by the scheduler.
type NetworkResource struct {
	Mode          string
	ReservedPorts []Port `json:",omitempty"`
	DynamicPorts  []Port `json:",omitempty"`
}

// Port is one port label of a network block. Value is the host port
// (static ports only, in a job); To is the port the task listens on when
// it differs (-1: the same as the host port); HostNetwork is accepted for
// Nomad job files and must be empty or "default".
type Port struct {
	Label       string
	Value       int
	To          int
	HostNetwork string `json:",omitempty"`
}

// NodeResources is what a node offers beyond CPU and memory; for now its
// dynamic port range, as the client configures it.
type NodeResources struct {
	MinDynamicPort int
	MaxDynamicPort int
}

// DynamicPortRange is the node's range, or Nomad's default.
func (n *Node) DynamicPortRange() (lo, hi int) {
	lo, hi = DefaultMinDynamicPort, DefaultMaxDynamicPort
	if r := n.NodeResources; r != nil && r.MinDynamicPort > 0 && r.MaxDynamicPort >= r.MinDynamicPort {
		lo, hi = r.MinDynamicPort, r.MaxDynamicPort
	}
	return lo, hi
}

// AllocatedResources is what the scheduler gave an allocation beyond its
// Resources, in Nomad's shape.
type AllocatedResources struct {
	Shared AllocatedSharedResources
}

// AllocatedSharedResources are the group-wide resources: its ports.
type AllocatedSharedResources struct {
	Ports []AllocatedPortMapping `json:",omitempty"`
}

// AllocatedPortMapping is one port an allocation holds on its node: host
// port Value at HostIP, To inside the task (0: the same).
type AllocatedPortMapping struct {
	Label  string
	Value  int
	To     int
	HostIP string
}

// Ports are the host ports the allocation holds.
func (a *Allocation) Ports() []AllocatedPortMapping {
	if a.AllocatedResources == nil {
		return nil
	}
	return a.AllocatedResources.Shared.Ports
}

// TaskPort is the port a task listens on for m: To when set, else the
// host port.
func (m AllocatedPortMapping) TaskPort() int {
	if m.To > 0 {
		return m.To
	}
	return m.Value
}

// validPortLabel: labels become NOMAD_PORT_<label>, so letters, digits
// and underscores only, as Nomad requires.
func validPortLabel(s string) bool {
	if s == "" || len(s) > maxPortLabel {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
		default:
			return false
		}
	}
	return true
}

// validateNetworks adds the problems of a group's network blocks.
func (tg *TaskGroup) validateNetworks(add func(string, ...any)) {
	if len(tg.Networks) > 1 {
		add("network: only one network block is allowed, got %d", len(tg.Networks))
	}
	labels := map[string]bool{}
	static := map[int]string{}
	total := 0
	for _, n := range tg.Networks {
		if n == nil {
			add("network: empty block")
			continue
		}
		switch n.Mode {
		case "", NetworkModeHost:
		case NetworkModeBridge:
			add("network: mode %q is not supported yet; Roam has host networking only (mode = %q)", n.Mode, NetworkModeHost)
		default:
			add("network: mode %q is not valid (host)", n.Mode)
		}
		total += len(n.ReservedPorts) + len(n.DynamicPorts)
		check := func(p Port, isStatic bool) {
			name := strconv.Quote(p.Label)
			switch {
			case !validPortLabel(p.Label):
				add("network: port label %s must be 1 to %d letters, digits or underscores", name, maxPortLabel)
				return
			case labels[p.Label]:
				add("network: port label %s is used twice", name)
			}
			labels[p.Label] = true
			if isStatic {
				if p.Value < 1 || p.Value > 65535 {
					add("network: port %s: static %d is outside 1-65535", name, p.Value)
				} else if other, dup := static[p.Value]; dup {
					add("network: port %s: static %d is also port %q", name, p.Value, other)
				} else {
					static[p.Value] = p.Label
				}
			} else if p.Value != 0 {
				add("network: port %s: a dynamic port has no static value (got %d)", name, p.Value)
			}
			switch {
			case p.To < -1 || p.To > 65535:
				add("network: port %s: to %d is outside 1-65535 (or -1, the host port)", name, p.To)
			case p.To > 0 && (!isStatic || p.To != p.Value):
				// Host networking has no port mapping: the task must
				// listen on the host port itself.
				add("network: port %s: to %d needs a port mapping, which host networking does not have; "+
					"drop to, or make it the static port", name, p.To)
			}
			if p.HostNetwork != "" && p.HostNetwork != "default" {
				add("network: port %s: host_network %q is not supported; only the default", name, p.HostNetwork)
			}
		}
		for _, p := range n.ReservedPorts {
			check(p, true)
		}
		for _, p := range n.DynamicPorts {
			check(p, false)
		}
	}
	if total > MaxGroupPorts {
		add("network: %d ports, at most %d", total, MaxGroupPorts)
	}
}

// PortCollision names the first of ports already in use, for placement
// metrics, as Nomad words it.
func PortCollision(label string, port int) string {
	return fmt.Sprintf("network: reserved port collision %s=%d", label, port)
}

// validateLifecycle adds the problems of the group's lifecycle blocks: a
// hook Nomad has, no sidecar poststop, and at least one main task.
func (tg *TaskGroup) validateLifecycle(add func(string, ...any)) {
	mains := 0
	for _, t := range tg.Tasks {
		if t == nil {
			continue
		}
		lc := t.Lifecycle
		if lc == nil {
			mains++
			continue
		}
		switch lc.Hook {
		case TaskLifecycleHookPrestart, TaskLifecycleHookPoststart:
		case TaskLifecycleHookPoststop:
			if lc.Sidecar {
				add("task %q: lifecycle: a poststop task cannot be a sidecar", t.Name)
			}
		default:
			add("task %q: lifecycle: hook %q is not one of prestart, poststart, poststop", t.Name, lc.Hook)
		}
		if t.CSIPluginConfig != nil {
			add("task %q: lifecycle: a csi_plugin task runs beside the group's tasks; it takes no lifecycle block", t.Name)
		}
	}
	if len(tg.Tasks) > 0 && mains == 0 {
		add("every task has a lifecycle hook; a group needs at least one main task")
	}
}
