// Package upgrade decides when a change in what servers send may be used
// in a cluster whose servers run different builds: while one server
// upgrades at a time, a server or client of the older build must never be
// sent what it does not understand, and a rule the older build cannot keep
// must not be enforced against it.
//
// The rule (docs/upgrades.md): every change that an older build would
// misread or break is a Feature with the version that brought it, and is
// used only once every server the cluster knows (alive or failed; not
// those that left) runs that version or newer. A server whose build is
// missing or unreadable counts as the oldest. The minimum is the leader's
// to compute and to pass on, so that clients follow the same gate.
package upgrade

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is a build's major.minor.patch.
type Version struct{ Major, Minor, Patch uint64 }

// Oldest is the version of a build that does not say which it is.
var Oldest = Version{}

// Parse reads "1.2.3", with an optional leading "v" and any "-pre" or
// "+meta" suffix ignored.
func Parse(s string) (Version, error) {
	raw := s
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return Oldest, fmt.Errorf("upgrade: version %q is not major.minor.patch", raw)
	}
	var n [3]uint64
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return Oldest, fmt.Errorf("upgrade: version %q: part %q is not a number", raw, p)
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, nil
}

// MustParse is Parse for versions written in the code.
func MustParse(s string) Version {
	v, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return v
}

// Less reports whether v is older than o.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Min is the oldest of builds, each read as Parse does; one that cannot be
// read counts as Oldest. ok is false for no builds at all.
func Min(builds []string) (min Version, ok bool) {
	for i, b := range builds {
		v, err := Parse(b)
		if err != nil {
			v = Oldest
		}
		if i == 0 || v.Less(min) {
			min = v
		}
	}
	return min, len(builds) > 0
}

// Feature is a change an older build would not understand or keep.
type Feature struct {
	Name  string
	Since Version
}

// Enabled reports whether f may be used with min the oldest server build.
func (f Feature) Enabled(min Version) bool { return !min.Less(f.Since) }

// LaneTermRequired: every controller call a server sends carries its
// lane's leader term (builds before it send 0, which clients had to let
// through unfenced). Once every server has it, clients refuse a call
// without a term as they refuse one of a stale term.
var LaneTermRequired = Feature{Name: "lane term required on controller calls", Since: MustParse("0.2.0")}

// ControllerConcurrency: a plugin's lanes, on the leader and on its
// clients, run up to its controller_concurrency calls at once, and each
// controller answer says whether a call that arrived at the client before
// it was still running (structs.CSIControllerReply). A leader of an older
// build reads any answer as "every earlier call has ended", which holds
// only for a lane that runs one call at a time, so until every server has
// it both lanes run one.
var ControllerConcurrency = Feature{Name: "controller calls run concurrently per controller_concurrency", Since: MustParse("0.3.0")}
