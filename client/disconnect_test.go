package client

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestStopWindow(t *testing.T) {
	s := time.Second
	cases := []struct {
		name                 string
		stop, free, kill     time.Duration
		want                 time.Duration
		wantEnabled, wantFit bool
	}{
		{"disabled", 0, 20 * s, 5 * s, 0, false, true},
		{"servers not heard yet", 10 * s, 0, 5 * s, 10 * s, true, true},
		{"defaults nest", 10 * s, 20 * s, 5 * s, 10 * s, true, true},
		{"long kill timeout shortens it", 10 * s, 20 * s, 10 * s, 8*s - time.Millisecond, true, false},
		{"exactly at the limit does not fit", 13 * s, 20 * s, 5 * s, 13*s - time.Millisecond, true, false},
		{"no room at all stops at once", 10 * s, 4 * s, 5 * s, 0, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, enabled, fits := StopWindow(tc.stop, tc.free, tc.kill)
			must.Eq(t, tc.want, got)
			must.Eq(t, tc.wantEnabled, enabled)
			must.Eq(t, tc.wantFit, fits)
			if enabled && tc.free > tc.kill+StopMargin {
				must.Less(t, tc.free, got+tc.kill+StopMargin)
			}
		})
	}
}

func TestOutageStop_AfterARestart(t *testing.T) {
	s := time.Second
	// Running since the last contact: stop_on_client_after.
	stop, fits := outageStop(3*s, 10*s, 2*s, 0, false)
	must.Eq(t, 3*s, stop)
	must.True(t, fits)
	// Restarted with that contact read back: up to the edge of the
	// servers' window, so that a first heartbeat can show nothing is
	// wrong, and never past it.
	stop, _ = outageStop(3*s, 10*s, 2*s, 0, true)
	must.Eq(t, 10*s-2*s-StopMargin, stop)
	must.True(t, stop+2*s+StopMargin <= 10*s, must.Sprint("past the servers' window"))
	// The servers' window not known: the configured stop.
	stop, _ = outageStop(3*s, 0, 2*s, 0, true)
	must.Eq(t, 3*s, stop)
	// Never under a heartbeat TTL.
	stop, _ = outageStop(3*s, 10*s, 2*s, 5*s, false)
	must.Eq(t, 5*s, stop)
}
