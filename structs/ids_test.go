package structs

import (
	"errors"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestValidateID(t *testing.T) {
	cases := []struct {
		name string
		id   string
		want string // substring of the error; "" means valid
	}{
		{name: "plain", id: "vol1"},
		{name: "dashes dots underscores", id: "ebs_prod-db.1"},
		{name: "per-alloc index", id: "data[2]"},
		{name: "uuid", id: "8d3ae7b2-3c5e-4b9d-9a43-3d2b1a0e6f11"},
		{name: "digit first", id: "1vol"},
		{name: "at the limit", id: strings.Repeat("a", MaxIDBytes)},
		{name: "empty", id: "", want: `volume ID "" is empty`},
		{name: "over the limit", id: strings.Repeat("a", MaxIDBytes+1), want: "is 129 bytes; at most 128 bytes are allowed"},
		{name: "dot", id: ".", want: `volume ID "." must start with a letter or a digit`},
		{name: "dot dot", id: "..", want: `volume ID ".." must start with a letter or a digit`},
		{name: "hidden", id: ".vol", want: "must start with a letter or a digit"},
		{name: "flag-like", id: "-rf", want: "must start with a letter or a digit"},
		{name: "bracket first", id: "[0]", want: "must start with a letter or a digit"},
		{name: "traversal", id: strings.Repeat("../", 10) + "victim", want: `"../../../../../../../../../../victim" must start`},
		{name: "inner traversal", id: "a/../../x", want: `holds '/' at byte 1`},
		{name: "slash", id: "a/b", want: `volume ID "a/b" holds '/' at byte 1`},
		{name: "backslash", id: `a\b`, want: `holds '\\' at byte 1`},
		{name: "nul", id: "vol\x00x", want: `volume ID "vol\x00x" holds a NUL at byte 3`},
		{name: "newline", id: "vol\nx", want: `"vol\nx" holds the control character '\n' at byte 3`},
		{name: "delete", id: "vol\x7f", want: "control character"},
		{name: "space", id: "my vol", want: `holds ' ' at byte 2`},
		{name: "non-ascii", id: "volé", want: "holds a non-ASCII byte at byte 3"},
		{name: "colon", id: "a:b", want: `holds ':' at byte 1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateID(IDKindVolume, tc.id)
			if tc.want == "" {
				must.NoError(t, err)
				return
			}
			must.Error(t, err)
			must.ErrorIs(t, err, ErrInvalidRequest)
			must.StrContains(t, err.Error(), tc.want)
			must.StrContains(t, err.Error(), IDKindVolume)
			var idErr *InvalidIDError
			must.True(t, errors.As(err, &idErr))
			must.Eq(t, tc.id, idErr.ID)
		})
	}
}

// An over-long ID is named in the error but not echoed whole.
func TestValidateID_LongIDCutShort(t *testing.T) {
	id := strings.Repeat("x", 1<<20)
	err := ValidateID(IDKindJob, id)
	must.Error(t, err)
	must.Less(t, 200, len(err.Error()))
	must.StrContains(t, err.Error(), `job ID "xxxxxxxx`)
}

func TestValidateExternalID(t *testing.T) {
	cases := []struct {
		name string
		id   string
		want string
	}{
		{name: "hostpath", id: "vol-0123456789abcdef"},
		{name: "cloud path", id: "projects/p/zones/z/disks/d"},
		{name: "arn", id: "arn:aws:ec2:us-east-1:123:volume/vol-1"},
		{name: "unicode", id: "disque-é"},
		{name: "at the limit", id: strings.Repeat("a", MaxIDBytes)},
		{name: "empty", id: "", want: "is empty"},
		{name: "over the limit", id: strings.Repeat("a", MaxIDBytes+1), want: "at most 128 bytes"},
		{name: "nul", id: "vol\x00", want: `"vol\x00" holds the control character U+0000 at byte 3`},
		{name: "escape", id: "vol\x1b[2J", want: "control character U+001B"},
		{name: "c1 control", id: "vol\u0085", want: "control character U+0085"},
		{name: "invalid utf-8", id: "vol\xff", want: "is not valid UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateExternalID(IDKindExternalVol, tc.id)
			if tc.want == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, ErrInvalidRequest)
			must.StrContains(t, err.Error(), IDKindExternalVol)
			must.StrContains(t, err.Error(), tc.want)
		})
	}
}

func TestNode_ValidateIDs(t *testing.T) {
	good := func() *Node {
		return &Node{
			ID: "8d3ae7b2-3c5e-4b9d-9a43-3d2b1a0e6f11", SecretID: "s", Datacenter: "dc1", Name: "client-1",
			CSINodePlugins: map[string]*CSIInfo{"hostpath": {PluginID: "hostpath"}},
		}
	}
	must.NoError(t, good().Validate())
	cases := []struct {
		name string
		edit func(n *Node)
		want string
	}{
		{"node ID with slash", func(n *Node) { n.ID = "../../x" }, `node ID "../../x"`},
		{"node name with nul", func(n *Node) { n.Name = "a\x00" }, `node name "a\x00" holds a NUL`},
		{"node plugin ID traversal", func(n *Node) {
			n.CSINodePlugins = map[string]*CSIInfo{"../evil": {PluginID: "../evil"}}
		}, `plugin ID "../evil"`},
		{"controller plugin ID with slash", func(n *Node) {
			n.CSIControllerPlugins = map[string]*CSIInfo{"a/b": {PluginID: "a/b"}}
		}, `plugin ID "a/b"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := good()
			tc.edit(n)
			err := n.Validate()
			must.ErrorIs(t, err, ErrInvalidRequest)
			must.StrContains(t, err.Error(), tc.want)
		})
	}
}
