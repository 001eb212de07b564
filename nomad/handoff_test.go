package nomad

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/roamhq/roam/structs"
)

func others(servers []*Server, not *Server) []*Server {
	var out []*Server
	for _, s := range servers {
		if s != not {
			out = append(out, s)
		}
	}
	return out
}

// A leader that shuts down hands leadership over before it goes: when
// Shutdown returns, another server already leads, without an election
// timeout in between.
func TestHandoff_ShutdownTransfersLeadership(t *testing.T) {
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	must.NoError(t, leader.Shutdown(context.Background()))

	rest := others(servers, leader)
	leaders := 0
	for _, s := range rest {
		if s.IsLeader() {
			leaders++
		}
	}
	must.Eq(t, 1, leaders, must.Sprint("a new leader exists the moment Shutdown returns"))
	waitForLeader(t, rest...)
}

// The departing leader refuses new controller calls (retryable) but lets
// the one in flight finish before it hands over and shuts down.
func TestHandoff_WaitsForInFlightControllerCall(t *testing.T) {
	servers := testCluster(t, 3)
	leader := waitForLeaderDuties(t, servers...)
	lanes := leader.lanes.Load()
	must.NotNil(t, lanes)

	started, release, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		_ = lanes.Do(context.Background(), "hostpath", "publish", func(ctx context.Context) error {
			close(started)
			<-release
			close(finished)
			return nil
		})
	}()
	<-started

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- leader.Shutdown(context.Background()) }()

	// The handoff has begun once the leader's duties (and lanes) are gone.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return leader.lanes.Load() == nil }),
		wait.Timeout(5*time.Second), wait.Gap(5*time.Millisecond)))
	err := lanes.Do(context.Background(), "hostpath", "publish", func(context.Context) error {
		t.Error("a new controller call started during the handoff")
		return nil
	})
	must.ErrorIs(t, err, structs.ErrNoLeader)
	must.True(t, structs.IsRetryable(err))
	select {
	case err := <-shutdownDone:
		t.Fatalf("shutdown finished while a controller call was in flight: %v", err)
	default:
	}

	close(release)
	<-finished
	must.NoError(t, <-shutdownDone)
	waitForLeader(t, others(servers, leader)...)
}
