package command

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/api"
)

// fuzzMaxInput skips inputs the fuzzer grew past what a test input
// needs: the HCL parser takes seconds on 100 KB of nested expressions.
const fuzzMaxInput = 64 << 10

// fuzzMaxNesting skips input nested deeper than this: hclsyntax recurses
// once per bracket and a deep enough input overflows the goroutine stack,
// a fatal error the fuzzer cannot report. The volume spec parser has no
// nesting limit of its own yet; once it refuses deep input before it
// parses, this guard goes.
const fuzzMaxNesting = 1000

func tooDeep(src []byte) bool {
	depth := 0
	for _, b := range src {
		switch b {
		case '{', '[', '(':
			depth++
			if depth > fuzzMaxNesting {
				return true
			}
		case '}', ']', ')':
			if depth > 0 {
				depth--
			}
		}
	}
	return false
}

// FuzzVolumeSpec parses volume specs as `roam volume register` and
// `roam volume create` do. A spec that register accepts, create accepts
// as the same volume; capacities are never negative; parsing is
// deterministic; and the volume survives the JSON the API client sends.
func FuzzVolumeSpec(f *testing.F) {
	f.Add([]byte(volumeSpec))
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > fuzzMaxInput || tooDeep(src) {
			t.Skip()
		}
		vol, err := parseVolumeSpec("fuzz.hcl", src)
		created, cerr := parseVolumeCreateSpec("fuzz.hcl", src)
		if cerr == nil {
			checkVolume(t, created)
		}
		if err != nil {
			must.Nil(t, vol, must.Sprintf("a volume came with the error %v", err))
			return
		}
		checkVolume(t, vol)
		must.NoError(t, cerr, must.Sprint("create refuses a spec that register accepts"))
		must.Eq(t, vol, created, must.Sprint("create reads a spec that register accepts differently"))

		again, err := parseVolumeSpec("fuzz.hcl", src)
		must.NoError(t, err)
		must.Eq(t, vol, again)

		body, err := json.Marshal(&api.CSIVolumeRegisterRequest{Volumes: []*api.CSIVolume{vol}})
		must.NoError(t, err)
		var sent api.CSIVolumeRegisterRequest
		must.NoError(t, json.Unmarshal(body, &sent))
		must.SliceLen(t, 1, sent.Volumes)
		// An empty map and none are the same to the server; the API's
		// JSON leaves empty secrets out.
		if !reflect.DeepEqual(withoutEmptyMaps(vol), withoutEmptyMaps(sent.Volumes[0])) {
			t.Fatalf("the volume changed in the request's JSON:\nparsed: %#v\nsent:   %#v", vol, sent.Volumes[0])
		}
	})
}

// checkVolume checks what holds for any volume a spec parses to.
func checkVolume(t *testing.T, vol *api.CSIVolume) {
	t.Helper()
	must.NotNil(t, vol)
	must.NonNegative(t, vol.RequestedCapacityMin, must.Sprint("capacity_min"))
	must.NonNegative(t, vol.RequestedCapacityMax, must.Sprint("capacity_max"))
	for _, c := range vol.RequestedCapabilities {
		must.NotNil(t, c)
	}
}

// withoutEmptyMaps is a copy of vol with its empty maps nil.
func withoutEmptyMaps(vol *api.CSIVolume) *api.CSIVolume {
	v := *vol
	for _, m := range []*map[string]string{&v.Secrets, &v.Parameters, &v.Context} {
		if len(*m) == 0 {
			*m = nil
		}
	}
	return &v
}

// TestParseVolumeSpec_CapacityRange: a capacity past what int64 holds is
// refused by name. Such a capacity used to wrap to math.MinInt64 and go
// to the server as a negative size (found by FuzzVolumeSpec).
func TestParseVolumeSpec_CapacityRange(t *testing.T) {
	spec := func(capacity string) []byte {
		return []byte("id = \"v\"\ntype = \"csi\"\nplugin_id = \"p\"\nexternal_id = \"e\"\ncapacity_max = " + capacity + "\n")
	}
	for _, tc := range []struct {
		capacity string
		want     int64
	}{
		{"9223372036854775807", math.MaxInt64},
		{`"9223372036854775807"`, math.MaxInt64},
		{`"8388607TiB"`, 8388607 << 40},
		{`"1.5KiB"`, 1536},
		{"9007199254740993", 9007199254740993}, // past 2^53, read exactly
	} {
		vol, err := parseVolumeSpec("v.hcl", spec(tc.capacity))
		must.NoError(t, err, must.Sprint(tc.capacity))
		must.EqOp(t, tc.want, vol.RequestedCapacityMax, must.Sprint(tc.capacity))
	}
	for _, capacity := range []string{
		"9223372036854775808",
		"18446744073709551616",
		`"8388608TiB"`,
		`"9223372036854775807.0"`,
		`"99999999999999999999999999999"`,
		`"1` + strings.Repeat("0", 400) + `.5"`,
	} {
		_, err := parseVolumeSpec("v.hcl", spec(capacity))
		must.ErrorContains(t, err, "v.hcl:5,16: Invalid capacity_max", must.Sprint(capacity))
		must.ErrorContains(t, err, "bytes", must.Sprint(capacity))
	}
}

func TestTooDeep(t *testing.T) {
	must.True(t, tooDeep(bytes.Repeat([]byte("{"), fuzzMaxNesting+1)))
	must.False(t, tooDeep(bytes.Repeat([]byte("{}"), 10*fuzzMaxNesting)))
}
