package structs

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Limits on topologies from input.
const (
	MaxTopologies        = 16
	MaxTopologySegments  = 16
	MaxTopologySegmentSz = 128
)

// CSITopology is a set of topology segments (key/value pairs such as
// "zone" = "b"): where a volume is accessible, or where a node is.
type CSITopology struct {
	Segments map[string]string
}

// CSITopologyRequest is a volume spec's topology_request: a volume must be
// created accessible from one of Required (CSI's requisite), preferably
// from the first of Preferred.
type CSITopologyRequest struct {
	Required  []*CSITopology
	Preferred []*CSITopology
}

// String renders t as "k=v,k=v" in key order.
func (t *CSITopology) String() string {
	if t == nil || len(t.Segments) == 0 {
		return "{}"
	}
	parts := make([]string, 0, len(t.Segments))
	for _, k := range slices.Sorted(maps.Keys(t.Segments)) {
		parts = append(parts, k+"="+t.Segments[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Contains says whether a node at node lies inside t: every segment of t
// has the same value at the node. An empty t contains every node.
func (t *CSITopology) Contains(node *CSITopology) bool {
	if t == nil {
		return true
	}
	for k, v := range t.Segments {
		if node == nil || node.Segments[k] != v {
			return false
		}
	}
	return true
}

// TopologiesString renders a list of topologies.
func TopologiesString(ts []*CSITopology) string {
	parts := make([]string, 0, len(ts))
	for _, t := range ts {
		parts = append(parts, t.String())
	}
	return strings.Join(parts, " or ")
}

// Copy returns a deep copy.
func (t *CSITopology) Copy() *CSITopology {
	if t == nil {
		return nil
	}
	return &CSITopology{Segments: maps.Clone(t.Segments)}
}

// CopyTopologies deep-copies a list.
func CopyTopologies(ts []*CSITopology) []*CSITopology {
	if ts == nil {
		return nil
	}
	out := make([]*CSITopology, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.Copy())
	}
	return out
}

// Copy returns a deep copy.
func (r *CSITopologyRequest) Copy() *CSITopologyRequest {
	if r == nil {
		return nil
	}
	return &CSITopologyRequest{Required: CopyTopologies(r.Required), Preferred: CopyTopologies(r.Preferred)}
}

// TopologiesEqual compares two lists in order.
func TopologiesEqual(a, b []*CSITopology) bool {
	return slices.EqualFunc(a, b, func(x, y *CSITopology) bool {
		return maps.Equal(x.Segments, y.Segments)
	})
}

// Validate checks a topology request from input against the limits.
func (r *CSITopologyRequest) Validate() error {
	if r == nil {
		return nil
	}
	for what, ts := range map[string][]*CSITopology{"required": r.Required, "preferred": r.Preferred} {
		if len(ts) > MaxTopologies {
			return fmt.Errorf("%w: topology_request %s has %d topologies; at most %d", ErrInvalidRequest, what, len(ts), MaxTopologies)
		}
		for _, t := range ts {
			if t == nil || len(t.Segments) == 0 {
				return fmt.Errorf("%w: topology_request %s holds a topology without segments", ErrInvalidRequest, what)
			}
			if len(t.Segments) > MaxTopologySegments {
				return fmt.Errorf("%w: topology_request %s: %d segments; at most %d", ErrInvalidRequest, what, len(t.Segments), MaxTopologySegments)
			}
			for k, v := range t.Segments {
				if k == "" || len(k) > MaxTopologySegmentSz || len(v) > MaxTopologySegmentSz {
					return fmt.Errorf("%w: topology_request %s: segment %.40q must have a key and both at most %d bytes",
						ErrInvalidRequest, what, k, MaxTopologySegmentSz)
				}
			}
		}
	}
	return nil
}
