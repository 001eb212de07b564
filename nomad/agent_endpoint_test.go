package nomad

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// A call passed on once is answered where it lands or refused: a member
// list that maps an ID to the wrong address cannot make two servers pass
// it back and forth.
func TestAgentProfile_ForwardedOnceAtMost(t *testing.T) {
	s := testServer(t, nil)
	ep := &Agent{srv: s}
	var reply structs.AgentProfileResponse
	err := ep.Profile(&structs.AgentProfileRequest{ServerID: "some-other-server", Kind: "heap", Forwarded: true}, &reply)
	must.ErrorIs(t, err, structs.ErrNotFound)
	must.StrContains(t, err.Error(), `was asked for server "some-other-server"`)

	// Not forwarded yet: an unknown ID is refused by name.
	err = ep.Profile(&structs.AgentProfileRequest{ServerID: "some-other-server", Kind: "heap"}, &reply)
	must.ErrorIs(t, err, structs.ErrNotFound)
	must.StrContains(t, err.Error(), `no server with ID "some-other-server"`)

	// Bad requests are refused before any routing.
	err = ep.Profile(&structs.AgentProfileRequest{Kind: "cmdline"}, &reply)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	err = ep.Profile(&structs.AgentProfileRequest{Kind: structs.AgentProfileMetrics, Seconds: 3}, &reply)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)

	// This server, with ACLs and enable_debug off, serves none.
	err = ep.Profile(&structs.AgentProfileRequest{ServerID: s.ID(), Kind: "heap"}, &reply)
	must.ErrorIs(t, err, structs.ErrPermissionDenied)
	must.StrContains(t, err.Error(), "enable_debug")
	must.Nil(t, reply.Payload)
}
