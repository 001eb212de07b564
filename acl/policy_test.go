package acl

import (
	"errors"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestParse_Capabilities(t *testing.T) {
	all := []string{
		NamespaceCapabilityListJobs, NamespaceCapabilityReadJob, NamespaceCapabilitySubmitJob,
		NamespaceCapabilityReadLogs, NamespaceCapabilityReadFS, NamespaceCapabilityAllocLifecycle,
		NamespaceCapabilityCSIRegisterPlugin, NamespaceCapabilityCSIWriteVolume,
		NamespaceCapabilityCSIReadVolume, NamespaceCapabilityCSIListVolume,
		NamespaceCapabilityCSIMountVolume,
	}
	// Each capability granted alone allows itself and nothing else.
	for _, c := range all {
		t.Run(c, func(t *testing.T) {
			p, err := Parse(`namespace "default" { capabilities = ["` + c + `"] }`)
			must.NoError(t, err)
			a := New([]*Policy{p})
			for _, other := range all {
				must.Eq(t, other == c, a.AllowNamespaceOperation("default", other), must.Sprintf("granted %s, asked %s", c, other))
			}
			must.False(t, a.AllowNamespaceOperation("other", c))
			must.False(t, a.AllowNodeRead())
			must.False(t, a.AllowOperatorRead())
		})
	}
}

func TestParse_NamespacePolicies(t *testing.T) {
	cases := []struct {
		policy string
		allow  []string
		deny   []string
	}{
		{PolicyRead,
			[]string{NamespaceCapabilityListJobs, NamespaceCapabilityReadJob, NamespaceCapabilityCSIListVolume, NamespaceCapabilityCSIReadVolume},
			[]string{NamespaceCapabilitySubmitJob, NamespaceCapabilityCSIWriteVolume, NamespaceCapabilityCSIMountVolume, NamespaceCapabilityReadLogs, NamespaceCapabilityAllocLifecycle}},
		{PolicyWrite,
			[]string{NamespaceCapabilitySubmitJob, NamespaceCapabilityReadJob, NamespaceCapabilityCSIWriteVolume, NamespaceCapabilityCSIMountVolume, NamespaceCapabilityReadLogs, NamespaceCapabilityAllocLifecycle},
			[]string{NamespaceCapabilityCSIRegisterPlugin}},
		{PolicyDeny, nil, []string{NamespaceCapabilityListJobs, NamespaceCapabilityReadJob}},
	}
	for _, tc := range cases {
		t.Run(tc.policy, func(t *testing.T) {
			p, err := Parse(`namespace "default" { policy = "` + tc.policy + `" }`)
			must.NoError(t, err)
			a := New([]*Policy{p})
			for _, c := range tc.allow {
				must.True(t, a.AllowNamespaceOperation("default", c), must.Sprint(c))
			}
			for _, c := range tc.deny {
				must.False(t, a.AllowNamespaceOperation("default", c), must.Sprint(c))
			}
		})
	}
}

func TestParse_CoarseBlocks(t *testing.T) {
	cases := []struct {
		rules string
		check func(a *ACL) bool
		want  bool
	}{
		{`node { policy = "read" }`, (*ACL).AllowNodeRead, true},
		{`node { policy = "read" }`, (*ACL).AllowNodeWrite, false},
		{`node { policy = "write" }`, (*ACL).AllowNodeWrite, true},
		{`node { policy = "deny" }`, (*ACL).AllowNodeRead, false},
		{`agent { policy = "read" }`, (*ACL).AllowAgentRead, true},
		{`agent { policy = "read" }`, (*ACL).AllowAgentWrite, false},
		{`agent { policy = "write" }`, (*ACL).AllowAgentWrite, true},
		{`operator { policy = "read" }`, (*ACL).AllowOperatorRead, true},
		{`operator { policy = "read" }`, (*ACL).AllowOperatorWrite, false},
		{`operator { policy = "write" }`, (*ACL).AllowOperatorWrite, true},
		{`plugin { policy = "list" }`, (*ACL).AllowPluginList, true},
		{`plugin { policy = "list" }`, (*ACL).AllowPluginRead, false},
		{`plugin { policy = "read" }`, (*ACL).AllowPluginRead, true},
		{`plugin { policy = "deny" }`, (*ACL).AllowPluginList, false},
	}
	for _, tc := range cases {
		t.Run(tc.rules, func(t *testing.T) {
			p, err := Parse(tc.rules)
			must.NoError(t, err)
			must.Eq(t, tc.want, tc.check(New([]*Policy{p})))
		})
	}
}

func TestNew_MergeDenyWins(t *testing.T) {
	p1, err := Parse(`namespace "default" { policy = "write" }
node { policy = "write" }`)
	must.NoError(t, err)
	p2, err := Parse(`namespace "default" { policy = "deny" }
node { policy = "deny" }`)
	must.NoError(t, err)
	a := New([]*Policy{p1, p2})
	must.False(t, a.AllowNamespaceOperation("default", NamespaceCapabilityReadJob))
	must.False(t, a.AllowNodeRead())

	// Union of capabilities across policies.
	p3, err := Parse(`namespace "default" { capabilities = ["submit-job"] }`)
	must.NoError(t, err)
	p4, err := Parse(`namespace "default" { capabilities = ["csi-mount-volume"] }`)
	must.NoError(t, err)
	b := New([]*Policy{p3, p4})
	must.True(t, b.AllowNamespaceOperation("default", NamespaceCapabilitySubmitJob))
	must.True(t, b.AllowNamespaceOperation("default", NamespaceCapabilityCSIMountVolume))
	must.False(t, b.AllowNamespaceOperation("default", NamespaceCapabilityCSIWriteVolume))
}

func TestNew_Globs(t *testing.T) {
	p, err := Parse(`namespace "*" { policy = "read" }
namespace "prod-*" { policy = "deny" }
namespace "default" { capabilities = ["submit-job"] }`)
	must.NoError(t, err)
	a := New([]*Policy{p})
	must.True(t, a.AllowNamespaceOperation("dev", NamespaceCapabilityReadJob))
	must.False(t, a.AllowNamespaceOperation("prod-eu", NamespaceCapabilityReadJob))
	// An exact block wins over globs.
	must.True(t, a.AllowNamespaceOperation("default", NamespaceCapabilitySubmitJob))
	must.False(t, a.AllowNamespaceOperation("default", NamespaceCapabilityReadJob))
}

func TestManagementAndDenyAll(t *testing.T) {
	must.True(t, ManagementACL.AllowNamespaceOperation("any", NamespaceCapabilityCSIWriteVolume))
	must.True(t, ManagementACL.AllowOperatorWrite())
	must.False(t, DenyAll.AllowNamespaceOperation("default", NamespaceCapabilityListJobs))
	must.False(t, DenyAll.AllowPluginList())
}

func TestParse_Invalid(t *testing.T) {
	cases := map[string]string{
		"empty":           ``,
		"syntax":          `namespace "default" {`,
		"bad policy":      `namespace "default" { policy = "admin" }`,
		"bad capability":  `namespace "default" { capabilities = ["launch-missiles"] }`,
		"unknown block":   `volume "x" { policy = "read" }`,
		"duplicate ns":    `namespace "a" { policy = "read" }` + "\n" + `namespace "a" { policy = "write" }`,
		"bad node":        `node { policy = "list" }`,
		"bad plugin":      `plugin { policy = "write" }`,
		"bad operator":    `operator { policy = "yes" }`,
		"missing policy":  `agent {}`,
		"unknown attr":    `namespace "default" { polcy = "read" }`,
		"too large":       strings.Repeat("#", MaxRulesSize+1),
		"namespace label": `namespace { policy = "read" }`,
	}
	for name, rules := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(rules)
			must.Error(t, err)
			must.True(t, errors.Is(err, ErrInvalidPolicy))
		})
	}
}
