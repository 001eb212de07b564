// Package taskenv interpolates the ${...} references of a task's config
// and env, as Nomad's client does: the task's environment (NOMAD_*,
// ROAM_*, its own env), ${node.unique.id}, ${node.unique.name},
// ${node.datacenter}, ${node.region}, ${node.class}, ${attr.<attribute>}
// and ${meta.<node meta>}. A reference to anything else is left as
// written.
package taskenv

import (
	"strings"

	"github.com/roamhq/roam/structs"
)

// NodeVars are the node's interpolation variables.
func NodeVars(n *structs.Node) map[string]string {
	if n == nil {
		return nil
	}
	vars := make(map[string]string, len(n.Attributes)+len(n.Meta)+5)
	vars["node.unique.id"] = n.ID
	vars["node.unique.name"] = n.Name
	vars["node.datacenter"] = n.Datacenter
	vars["node.class"] = n.NodeClass
	if r := n.Attributes["region"]; r != "" {
		vars["node.region"] = r
	}
	for k, v := range n.Attributes {
		vars["attr."+k] = v
	}
	for k, v := range n.Meta {
		vars["meta."+k] = v
	}
	return vars
}

// Interpolate replaces each ${name} in s whose name one of vars holds
// with its value, in one pass: a value is not interpolated again.
func Interpolate(s string, vars ...map[string]string) string {
	if !strings.Contains(s, "${") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := strings.IndexByte(s[i+2:], '}')
		if j < 0 {
			b.WriteString(s)
			return b.String()
		}
		name := s[i+2 : i+2+j]
		b.WriteString(s[:i])
		if v, ok := lookup(name, vars); ok {
			b.WriteString(v)
		} else {
			b.WriteString(s[i : i+3+j])
		}
		s = s[i+3+j:]
	}
}

func lookup(name string, vars []map[string]string) (string, bool) {
	for _, m := range vars {
		if v, ok := m[name]; ok {
			return v, true
		}
	}
	return "", false
}

// Env interpolates the values of a task's environment against the
// environment itself (as it is before interpolation) and the node's
// variables.
func Env(env, node map[string]string) map[string]string {
	out := make(map[string]string, len(env))
	for k, v := range env {
		out[k] = Interpolate(v, env, node)
	}
	return out
}
