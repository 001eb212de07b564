//go:build e2e

package e2e

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestHarness_ParseTable(t *testing.T) {
	t.Parallel()
	out := `Name             Address    Port  Status  Leader  Raft Version  Build
server-0.global  127.0.0.1  4648  alive   true    3
server-1.global  127.0.0.1  4649  failed  false   3             0.1 dev

`
	tab, err := ParseTable(out)
	must.NoError(t, err)
	must.Eq(t, []string{"Name", "Address", "Port", "Status", "Leader", "Raft Version", "Build"}, tab.Header)
	names, err := tab.Column("name")
	must.NoError(t, err)
	must.Eq(t, []string{"server-0.global", "server-1.global"}, names)
	v, err := tab.Get(1, "RaftVersion")
	must.NoError(t, err)
	must.Eq(t, "3", v)
	v, err = tab.Get(0, "Build")
	must.NoError(t, err)
	must.Eq(t, "", v)
	v, err = tab.Get(1, "Build")
	must.NoError(t, err)
	must.Eq(t, "0.1 dev", v)
	_, err = tab.Column("Missing")
	must.Error(t, err)

	// A row that does not line up with its header is split on wide gaps.
	tab, err = ParseTable("ID  Status\nabcdef12  ready\n")
	must.NoError(t, err)
	st, err := tab.Column("Status")
	must.NoError(t, err)
	must.Eq(t, []string{"ready"}, st)
}

func TestHarness_WithAddress(t *testing.T) {
	t.Parallel()
	cmds := map[string]bool{"node status": true, "operator raft list-peers": true, "status": true}
	cases := []struct{ in, want []string }{
		{[]string{"node", "status"}, []string{"node", "status", "-address", "A"}},
		{[]string{"node", "status", "abc"}, []string{"node", "status", "-address", "A", "abc"}},
		{[]string{"node", "status", "-verbose", "abc"}, []string{"node", "status", "-address", "A", "-verbose", "abc"}},
		{[]string{"status"}, []string{"status", "-address", "A"}},
		{[]string{"operator", "raft", "list-peers"}, []string{"operator", "raft", "list-peers", "-address", "A"}},
		{[]string{"unknown", "-x"}, []string{"unknown", "-address", "A", "-x"}},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, withAddress(cmds, "A", tc.in))
	}
}
