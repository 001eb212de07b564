package jobspec

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// Job files refer to values only the client knows: ${NOMAD_PORT_http},
// ${node.unique.name}, ${attr.kernel.name}, ${meta.rack}. Roam's HCL has
// no variables of its own, so every variable an env or config expression
// names is such a reference: it is kept as the text "${...}" for the
// client to interpolate when it starts the task, as Nomad's job files
// expect.

// maxRuntimeRefDepth bounds the attribute chain of one reference.
const maxRuntimeRefDepth = 16

// runtimeContext is an evaluation context in which each variable expr
// refers to evaluates to its own "${...}" text. References by index
// (env["X"]) are not supported and are reported.
func runtimeContext(expr hcl.Expression) (*hcl.EvalContext, hcl.Diagnostics) {
	vars := expr.Variables()
	if len(vars) == 0 {
		return nil, nil
	}
	var diags hcl.Diagnostics
	roots := map[string]cty.Value{}
	// Each root is a tree of objects whose leaves are placeholders;
	// build it from every path used.
	trees := map[string]*refNode{}
	for _, tr := range vars {
		names, ok := traversalNames(tr)
		if !ok || len(names) > maxRuntimeRefDepth {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Unsupported reference",
				Detail:   "Only plain references such as ${NOMAD_PORT_http}, ${node.unique.name}, ${attr.kernel.name} or ${meta.rack} are interpolated by the client.",
				Subject:  tr.SourceRange().Ptr(),
			})
			continue
		}
		n := trees[names[0]]
		if n == nil {
			n = &refNode{}
			trees[names[0]] = n
		}
		if err := n.add(names, 1); err != nil {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Conflicting references",
				Detail:   err.Error(),
				Subject:  tr.SourceRange().Ptr(),
			})
		}
	}
	for name, n := range trees {
		roots[name] = n.value([]string{name})
	}
	return &hcl.EvalContext{Variables: roots}, diags
}

func traversalNames(tr hcl.Traversal) ([]string, bool) {
	names := make([]string, 0, len(tr))
	for _, step := range tr {
		switch s := step.(type) {
		case hcl.TraverseRoot:
			names = append(names, s.Name)
		case hcl.TraverseAttr:
			names = append(names, s.Name)
		default:
			return nil, false
		}
	}
	return names, true
}

// refNode is a node of a reference tree: a leaf (a whole reference) or an
// object of children.
type refNode struct {
	leaf     bool
	children map[string]*refNode
}

func (n *refNode) add(names []string, i int) error {
	if i == len(names) {
		if len(n.children) > 0 {
			return fmt.Errorf("${%s} is used both as a value and as an object", strings.Join(names, "."))
		}
		n.leaf = true
		return nil
	}
	if n.leaf {
		return fmt.Errorf("${%s} is used both as a value and as an object", strings.Join(names[:i], "."))
	}
	if n.children == nil {
		n.children = map[string]*refNode{}
	}
	c := n.children[names[i]]
	if c == nil {
		c = &refNode{}
		n.children[names[i]] = c
	}
	return c.add(names, i+1)
}

func (n *refNode) value(path []string) cty.Value {
	if n.leaf || len(n.children) == 0 {
		return cty.StringVal("${" + strings.Join(path, ".") + "}")
	}
	attrs := make(map[string]cty.Value, len(n.children))
	for name, c := range n.children {
		attrs[name] = c.value(append(append([]string(nil), path...), name))
	}
	return cty.ObjectVal(attrs)
}
