package csiclaim

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// The age of a claim in publishing runs from this server's first sighting
// of it unchanged; the stored stamp, whatever clock wrote it, plays no
// part beyond telling one write of the claim from the next.
func TestPublishAges(t *testing.T) {
	claim := func(st structs.CSIClaimState, stamp int64) *structs.CSIVolumeClaim {
		return &structs.CSIVolumeClaim{AllocationID: "a1", NodeID: "n1", State: st, UpdatedAt: stamp}
	}
	pub := structs.CSIVolumeClaimStatePublishing
	hourAgo := t0.Add(-time.Hour).UnixNano()
	var p PublishAges
	steps := []struct {
		what  string
		vol   string
		claim *structs.CSIVolumeClaim
		at    time.Duration // after t0, on this server's clock
		want  time.Duration
	}{
		{"first sighting, stamped an hour ago", "v1", claim(pub, hourAgo), 0, 0},
		{"unchanged 30s later", "v1", claim(pub, hourAgo), 30 * time.Second, 30 * time.Second},
		{"another volume's claim by the same allocation", "v2", claim(pub, hourAgo), 30 * time.Second, 0},
		{"written again (a new stamp, even an older one)", "v1", claim(pub, hourAgo-1), 40 * time.Second, 0},
		{"unchanged since that write", "v1", claim(pub, hourAgo-1), 100 * time.Second, time.Minute},
		{"this server's clock read earlier than the sighting", "v1", claim(pub, hourAgo-1), 10 * time.Second, 0},
		{"taken: no age, and forgotten", "v1", claim(structs.CSIVolumeClaimStateTaken, hourAgo-1), 200 * time.Second, 0},
		{"back in publishing with the old stamp: seen afresh", "v1", claim(pub, hourAgo-1), 300 * time.Second, 0},
		{"no claim", "v1", nil, 400 * time.Second, 0},
	}
	for _, s := range steps {
		must.EqOp(t, s.want, p.Of(s.vol, s.claim, t0.Add(s.at)), must.Sprint(s.what))
	}
	must.EqOp(t, 2, p.Len())
	p.Retain(func(vol, alloc string) bool { return vol == "v2" && alloc == "a1" })
	must.EqOp(t, 1, p.Len())
	must.EqOp(t, 470*time.Second, p.Of("v2", claim(pub, hourAgo), t0.Add(500*time.Second)), must.Sprint("v2 is kept"))
	must.EqOp(t, 0, p.Of("v1", claim(pub, hourAgo-1), t0.Add(500*time.Second)), must.Sprint("v1 was forgotten"))
}
