package agent

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// RaftTimers reach the server's Raft config; without them the server
// keeps the LAN timers that raft_multiplier scales.
func TestConfig_RaftTimersReachServer(t *testing.T) {
	t.Parallel()
	a := newTestAgent(t, nil)
	rc := a.Server().Config().RaftConfig
	must.NotNil(t, rc)
	must.Eq(t, TestConfig(t).RaftTimers.HeartbeatTimeout, rc.HeartbeatTimeout)
	must.Eq(t, TestConfig(t).RaftTimers.ElectionTimeout, rc.ElectionTimeout)
	must.Eq(t, TestConfig(t).RaftTimers.LeaderLeaseTimeout, rc.LeaderLeaseTimeout)
	waitForLeader(t, a)

	lan := newTestAgent(t, func(c *Config) { c.RaftTimers = nil; c.Client.Enabled = false })
	must.Nil(t, lan.Server().Config().RaftConfig)
}

// Timers Raft would refuse are refused by Validate, by name, before
// anything starts; Merge carries them.
func TestConfig_RaftTimersValidated(t *testing.T) {
	t.Parallel()
	must.NoError(t, TestConfig(t).Validate())
	ms := time.Millisecond
	for _, tc := range []struct {
		name    string
		timers  RaftTimers
		wantErr string
	}{
		{"heartbeat too short", RaftTimers{ms, 20 * ms, ms}, "raft heartbeat timeout = 1ms"},
		{"zero", RaftTimers{}, "raft heartbeat timeout = 0s"},
		{"election below heartbeat", RaftTimers{20 * ms, 10 * ms, 10 * ms}, "raft election timeout = 10ms"},
		{"lease too short", RaftTimers{20 * ms, 20 * ms, ms}, "raft leader lease timeout = 1ms"},
		{"lease above heartbeat", RaftTimers{20 * ms, 40 * ms, 30 * ms}, "raft leader lease timeout = 30ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := TestConfig(t)
			c.RaftTimers = &tc.timers
			must.ErrorContains(t, c.Validate(), tc.wantErr)
			_, err := NewAgent(c, io.Discard)
			must.ErrorContains(t, err, tc.wantErr)
		})
	}

	merged := DevConfig().Merge(&Config{RaftTimers: &RaftTimers{20 * ms, 20 * ms, 10 * ms}})
	must.Eq(t, &RaftTimers{20 * ms, 20 * ms, 10 * ms}, merged.RaftTimers)
	must.Nil(t, DevConfig().Merge(DevConfig()).RaftTimers)
}

// BenchmarkDevAgentLeads times a dev agent from NewAgent to leading, with
// the LAN Raft timers and with TestConfig's RaftTimers. Compare the two
// ns/op figures of one run.
func BenchmarkDevAgentLeads(b *testing.B) {
	for _, tc := range []struct {
		name   string
		timers bool
	}{{"lan-timers", false}, {"test-timers", true}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				c := TestConfig(b)
				c.Client.Enabled = false
				c.LogLevel = "ERROR"
				if !tc.timers {
					c.RaftTimers = nil
				}
				a, err := NewAgent(c, io.Discard)
				must.NoError(b, err)
				waitForLeader(b, a)
				b.StopTimer()
				must.NoError(b, a.Shutdown(context.Background()))
				b.StartTimer()
			}
		})
	}
}
