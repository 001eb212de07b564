package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// A dev agent with ACLs on waits for `roam acl bootstrap`: a client token
// does not start the plugin job, the first management token does, and a
// restore that replaces the store is followed.
func TestDevManagementSecret_WaitsForManagementToken(t *testing.T) {
	st, err := state.NewStateStore()
	must.NoError(t, err)
	var cur atomic.Pointer[state.StateStore]
	cur.Store(st)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	type result struct {
		secret string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		s, err := devManagementSecret(ctx, cur.Load)
		done <- result{s, err}
	}()

	must.NoError(t, st.UpsertACLTokens(10, []*structs.ACLToken{{
		AccessorID: "acc-client", SecretID: "sec-client", Type: structs.ACLClientToken, Policies: []string{"p"},
	}}))
	// A restore swaps the store; the management token is in the new one.
	restored, err := state.NewStateStore()
	must.NoError(t, err)
	must.NoError(t, restored.UpsertACLTokens(11, []*structs.ACLToken{{
		AccessorID: "acc-client", SecretID: "sec-client", Type: structs.ACLClientToken, Policies: []string{"p"},
	}}))
	cur.Store(restored)
	st.Abandon()
	select {
	case r := <-done:
		t.Fatalf("returned before any management token existed: %q, %v", r.secret, r.err)
	default:
	}
	must.NoError(t, restored.UpsertACLTokens(12, []*structs.ACLToken{{
		AccessorID: "acc-mgmt", SecretID: "sec-mgmt", Type: structs.ACLManagementToken,
	}}))
	r := <-done
	must.NoError(t, r.err)
	must.Eq(t, "sec-mgmt", r.secret)
}

// Shutdown ends the wait.
func TestDevManagementSecret_EndsWithContext(t *testing.T) {
	st, err := state.NewStateStore()
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = devManagementSecret(ctx, func() *state.StateStore { return st })
	must.ErrorIs(t, err, context.Canceled)
}

// The dev plugin job is an explicit agent option: the dev configuration
// alone (what embedding programs and tests start from) does not run it,
// and the option is kept across a config merge.
func TestDevCSIPlugin_IsAnOption(t *testing.T) {
	must.False(t, DevConfig().DevCSIPlugin)
	must.True(t, DevConfig().Merge(&Config{DevCSIPlugin: true}).DevCSIPlugin)
	on := DevConfig()
	on.DevCSIPlugin = true
	must.True(t, on.Merge(DefaultConfig()).DevCSIPlugin)

	a := newTestAgent(t, nil)
	must.False(t, a.wantDevCSIPlugin(), must.Sprint("a dev agent ran the plugin job without being asked"))
	a.config.DevCSIPlugin = true
	must.True(t, a.wantDevCSIPlugin())
	a.config.DevMode = false
	must.False(t, a.wantDevCSIPlugin(), must.Sprint("only a dev agent runs the dev plugin job"))
}
