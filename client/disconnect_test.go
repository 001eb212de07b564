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
