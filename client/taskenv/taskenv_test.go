package taskenv

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

func TestInterpolate(t *testing.T) {
	env := map[string]string{"NOMAD_PORT_http": "20001", "NOMAD_ALLOC_ID": "a1", "LOOP": "${LOOP}"}
	node := NodeVars(&structs.Node{ID: "n1", Name: "web-1", Datacenter: "dc1", NodeClass: "big",
		Attributes: map[string]string{"kernel.name": "linux", "unique.network.ip-address": "10.0.0.7"},
		Meta:       map[string]string{"rack": "r7"}})
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"${NOMAD_PORT_http}", "20001"},
		{"-listen=${attr.unique.network.ip-address}:${NOMAD_PORT_http}", "-listen=10.0.0.7:20001"},
		{"${node.unique.name}/${node.unique.id}/${node.datacenter}/${node.class}/${meta.rack}", "web-1/n1/dc1/big/r7"},
		{"${attr.kernel.name}", "linux"},
		{"${UNKNOWN} stays", "${UNKNOWN} stays"},
		{"${NOMAD_ALLOC_ID", "${NOMAD_ALLOC_ID"},
		{"$NOMAD_ALLOC_ID is for the shell", "$NOMAD_ALLOC_ID is for the shell"},
		{"${LOOP}", "${LOOP}"},
		{"${}x", "${}x"},
		{"a${NOMAD_ALLOC_ID}b${NOMAD_ALLOC_ID}", "aa1ba1"},
	} {
		must.Eq(t, tc.want, Interpolate(tc.in, env, node), must.Sprint(tc.in))
	}
	must.Eq(t, map[string]string{"NOMAD_PORT_http": "20001", "NOMAD_ALLOC_ID": "a1", "LOOP": "${LOOP}"}, Env(env, node))
	must.Eq(t, "20001@r7", Env(map[string]string{"NOMAD_PORT_http": "20001", "X": "${NOMAD_PORT_http}@${meta.rack}"}, node)["X"])
	must.Nil(t, NodeVars(nil))
}
