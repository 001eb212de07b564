// Package acl is Roam's policy language and the compiled rule sets that
// answer "may this token do that". It follows the shape of Nomad's ACL
// policies: namespace blocks with a policy and capabilities, and node,
// agent, operator and plugin blocks with a policy.
package acl

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// ErrInvalidPolicy wraps every reason a policy's rules are refused.
var ErrInvalidPolicy = errors.New("invalid acl policy")

// Coarse policies.
const (
	PolicyDeny  = "deny"
	PolicyRead  = "read"
	PolicyWrite = "write"
	PolicyList  = "list"
)

// Namespace capabilities.
const (
	NamespaceCapabilityDeny              = "deny"
	NamespaceCapabilityListJobs          = "list-jobs"
	NamespaceCapabilityReadJob           = "read-job"
	NamespaceCapabilitySubmitJob         = "submit-job"
	NamespaceCapabilityReadLogs          = "read-logs"
	NamespaceCapabilityReadFS            = "read-fs"
	NamespaceCapabilityAllocLifecycle    = "alloc-lifecycle"
	NamespaceCapabilityCSIRegisterPlugin = "csi-register-plugin"
	NamespaceCapabilityCSIWriteVolume    = "csi-write-volume"
	NamespaceCapabilityCSIReadVolume     = "csi-read-volume"
	NamespaceCapabilityCSIListVolume     = "csi-list-volume"
	NamespaceCapabilityCSIMountVolume    = "csi-mount-volume"
)

// validNamespaceCapabilities are the capabilities a policy may name.
var validNamespaceCapabilities = map[string]bool{
	NamespaceCapabilityDeny:              true,
	NamespaceCapabilityListJobs:          true,
	NamespaceCapabilityReadJob:           true,
	NamespaceCapabilitySubmitJob:         true,
	NamespaceCapabilityReadLogs:          true,
	NamespaceCapabilityReadFS:            true,
	NamespaceCapabilityAllocLifecycle:    true,
	NamespaceCapabilityCSIRegisterPlugin: true,
	NamespaceCapabilityCSIWriteVolume:    true,
	NamespaceCapabilityCSIReadVolume:     true,
	NamespaceCapabilityCSIListVolume:     true,
	NamespaceCapabilityCSIMountVolume:    true,
}

// namespacePolicyCapabilities expands a namespace's coarse policy.
func namespacePolicyCapabilities(policy string) []string {
	read := []string{
		NamespaceCapabilityListJobs, NamespaceCapabilityReadJob,
		NamespaceCapabilityCSIListVolume, NamespaceCapabilityCSIReadVolume,
	}
	switch policy {
	case PolicyDeny:
		return []string{NamespaceCapabilityDeny}
	case PolicyRead:
		return read
	case PolicyWrite:
		return append(read,
			NamespaceCapabilitySubmitJob, NamespaceCapabilityReadLogs,
			NamespaceCapabilityReadFS, NamespaceCapabilityAllocLifecycle,
			NamespaceCapabilityCSIWriteVolume, NamespaceCapabilityCSIMountVolume)
	}
	return nil
}

// Policy is one parsed policy document.
type Policy struct {
	Namespaces []*NamespacePolicy `hcl:"namespace,block"`
	Node       *CoarsePolicy      `hcl:"node,block"`
	Agent      *CoarsePolicy      `hcl:"agent,block"`
	Operator   *CoarsePolicy      `hcl:"operator,block"`
	Plugin     *CoarsePolicy      `hcl:"plugin,block"`
}

// NamespacePolicy is a namespace block; Name may hold a "*" glob.
type NamespacePolicy struct {
	Name         string   `hcl:"name,label"`
	Policy       string   `hcl:"policy,optional"`
	Capabilities []string `hcl:"capabilities,optional"`
}

// CoarsePolicy is a block that takes only a policy.
type CoarsePolicy struct {
	Policy string `hcl:"policy"`
}

// MaxRulesSize bounds a policy document, as every input is bounded.
const MaxRulesSize = 64 << 10

// Parse reads a policy document in HCL and checks every value in it.
func Parse(rules string) (*Policy, error) {
	if rules == "" {
		return nil, fmt.Errorf("%w: empty rules", ErrInvalidPolicy)
	}
	if len(rules) > MaxRulesSize {
		return nil, fmt.Errorf("%w: rules are %d bytes, more than the limit of %d", ErrInvalidPolicy, len(rules), MaxRulesSize)
	}
	file, diags := hclsyntax.ParseConfig([]byte(rules), "policy.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%w: %s", ErrInvalidPolicy, diags.Error())
	}
	p := &Policy{}
	if diags := gohcl.DecodeBody(file.Body, nil, p); diags.HasErrors() {
		return nil, fmt.Errorf("%w: %s", ErrInvalidPolicy, diags.Error())
	}
	seen := map[string]bool{}
	for _, ns := range p.Namespaces {
		if ns.Name == "" {
			return nil, fmt.Errorf("%w: namespace block without a name", ErrInvalidPolicy)
		}
		if seen[ns.Name] {
			return nil, fmt.Errorf("%w: namespace %q given twice", ErrInvalidPolicy, ns.Name)
		}
		seen[ns.Name] = true
		switch ns.Policy {
		case "", PolicyDeny, PolicyRead, PolicyWrite:
		default:
			return nil, fmt.Errorf("%w: namespace %q: invalid policy %q (want read, write or deny)", ErrInvalidPolicy, ns.Name, ns.Policy)
		}
		for _, c := range ns.Capabilities {
			if !validNamespaceCapabilities[c] {
				return nil, fmt.Errorf("%w: namespace %q: unknown capability %q", ErrInvalidPolicy, ns.Name, c)
			}
		}
	}
	for _, b := range []struct {
		name    string
		p       *CoarsePolicy
		allowed []string
	}{
		{"node", p.Node, []string{PolicyDeny, PolicyRead, PolicyWrite}},
		{"agent", p.Agent, []string{PolicyDeny, PolicyRead, PolicyWrite}},
		{"operator", p.Operator, []string{PolicyDeny, PolicyRead, PolicyWrite}},
		{"plugin", p.Plugin, []string{PolicyDeny, PolicyList, PolicyRead}},
	} {
		if b.p == nil {
			continue
		}
		ok := false
		for _, a := range b.allowed {
			ok = ok || b.p.Policy == a
		}
		if !ok {
			return nil, fmt.Errorf("%w: %s: invalid policy %q (want %s)", ErrInvalidPolicy, b.name, b.p.Policy, strings.Join(b.allowed, ", "))
		}
	}
	return p, nil
}

// ACL is the union of a token's policies, ready to answer checks. The zero
// value denies everything; Management allows everything.
type ACL struct {
	management bool
	// exact and globs map namespace patterns to their capability sets.
	exact                         map[string]map[string]bool
	globs                         []globRule
	node, agent, operator, plugin string
}

type globRule struct {
	pattern string
	caps    map[string]bool
}

// ManagementACL allows everything.
var ManagementACL = &ACL{management: true}

// DenyAll allows nothing.
var DenyAll = &ACL{}

// New merges policies into one ACL: for each namespace, the union of the
// capabilities, with deny winning; for each coarse block, the most
// permissive policy, with deny winning.
func New(policies []*Policy) *ACL {
	a := &ACL{exact: map[string]map[string]bool{}}
	globs := map[string]map[string]bool{}
	for _, p := range policies {
		for _, ns := range p.Namespaces {
			target := a.exact
			if strings.Contains(ns.Name, "*") {
				target = globs
			}
			caps := target[ns.Name]
			if caps == nil {
				caps = map[string]bool{}
				target[ns.Name] = caps
			}
			for _, c := range namespacePolicyCapabilities(ns.Policy) {
				caps[c] = true
			}
			for _, c := range ns.Capabilities {
				caps[c] = true
			}
		}
		a.node = mergeCoarse(a.node, p.Node)
		a.agent = mergeCoarse(a.agent, p.Agent)
		a.operator = mergeCoarse(a.operator, p.Operator)
		a.plugin = mergeCoarse(a.plugin, p.Plugin)
	}
	for pattern, caps := range globs {
		a.globs = append(a.globs, globRule{pattern: pattern, caps: caps})
	}
	// The most specific glob (the longest) wins, as in Nomad.
	sort.Slice(a.globs, func(i, j int) bool {
		if len(a.globs[i].pattern) != len(a.globs[j].pattern) {
			return len(a.globs[i].pattern) > len(a.globs[j].pattern)
		}
		return a.globs[i].pattern < a.globs[j].pattern
	})
	return a
}

var coarseRank = map[string]int{"": 0, PolicyList: 1, PolicyRead: 2, PolicyWrite: 3}

func mergeCoarse(cur string, p *CoarsePolicy) string {
	if p == nil || cur == PolicyDeny {
		return cur
	}
	if p.Policy == PolicyDeny || coarseRank[p.Policy] > coarseRank[cur] {
		return p.Policy
	}
	return cur
}

// IsManagement reports whether a allows everything.
func (a *ACL) IsManagement() bool { return a.management }

// AllowNamespaceOperation reports whether a has capability op in ns.
func (a *ACL) AllowNamespaceOperation(ns, op string) bool {
	if a.management {
		return true
	}
	caps := a.namespaceCaps(ns)
	if caps == nil || caps[NamespaceCapabilityDeny] {
		return false
	}
	return caps[op]
}

func (a *ACL) namespaceCaps(ns string) map[string]bool {
	if caps, ok := a.exact[ns]; ok {
		return caps
	}
	for _, g := range a.globs {
		if globMatch(g.pattern, ns) {
			return g.caps
		}
	}
	return nil
}

// globMatch matches name against pattern, where "*" matches any run of
// characters.
func globMatch(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	name = name[len(parts[0]):]
	last := len(parts) - 1
	for i := 1; i < last; i++ {
		idx := strings.Index(name, parts[i])
		if idx < 0 {
			return false
		}
		name = name[idx+len(parts[i]):]
	}
	return strings.HasSuffix(name, parts[last])
}

func allowCoarse(p string, write bool) bool {
	if write {
		return p == PolicyWrite
	}
	return p == PolicyRead || p == PolicyWrite
}

// AllowNodeRead and the others answer for the coarse blocks.
func (a *ACL) AllowNodeRead() bool      { return a.management || allowCoarse(a.node, false) }
func (a *ACL) AllowNodeWrite() bool     { return a.management || allowCoarse(a.node, true) }
func (a *ACL) AllowAgentRead() bool     { return a.management || allowCoarse(a.agent, false) }
func (a *ACL) AllowAgentWrite() bool    { return a.management || allowCoarse(a.agent, true) }
func (a *ACL) AllowOperatorRead() bool  { return a.management || allowCoarse(a.operator, false) }
func (a *ACL) AllowOperatorWrite() bool { return a.management || allowCoarse(a.operator, true) }

// AllowPluginRead allows reading one plugin; AllowPluginList listing them.
func (a *ACL) AllowPluginRead() bool {
	return a.management || a.plugin == PolicyRead
}
func (a *ACL) AllowPluginList() bool {
	return a.management || a.plugin == PolicyRead || a.plugin == PolicyList
}
