package structs

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestCSIVolume_CanClaim(t *testing.T) {
	vol := func(modes ...string) *CSIVolume {
		v := &CSIVolume{ID: "vol", Claims: map[string]*CSIVolumeClaim{}}
		for _, m := range modes {
			v.RequestedCapabilities = append(v.RequestedCapabilities, &CSIVolumeCapability{AccessMode: m, AttachmentMode: CSIAttachmentModeFilesystem})
		}
		return v
	}
	claim := func(alloc, node, mode, access string) *CSIVolumeClaim {
		return &CSIVolumeClaim{AllocationID: alloc, NodeID: node, Mode: mode, AccessMode: access,
			AttachmentMode: CSIAttachmentModeFilesystem, State: CSIVolumeClaimStateTaken}
	}
	const (
		snw = CSIAccessModeSingleNodeWriter
		snr = CSIAccessModeSingleNodeReader
		mnr = CSIAccessModeMultiNodeReader
		mns = CSIAccessModeMultiNodeSingleWriter
		mnm = CSIAccessModeMultiNodeMultiWriter
		w   = CSIVolumeClaimWrite
		r   = CSIVolumeClaimRead
	)
	cases := []struct {
		name     string
		modes    []string
		existing []*CSIVolumeClaim
		claim    *CSIVolumeClaim
		wantErr  error
	}{
		{"single-node-writer admits one writer", []string{snw}, nil, claim("a1", "n1", w, snw), nil},
		{"single-node-writer refuses a second writer on the same node", []string{snw},
			[]*CSIVolumeClaim{claim("a1", "n1", w, snw)}, claim("a2", "n1", w, snw), ErrCSIMaxClaims},
		{"single-node-writer refuses a reader on another node", []string{snw},
			[]*CSIVolumeClaim{claim("a1", "n1", w, snw)}, claim("a2", "n2", r, snw), ErrCSIMaxClaims},
		{"single-node-writer admits a reader on the same node", []string{snw},
			[]*CSIVolumeClaim{claim("a1", "n1", w, snw)}, claim("a2", "n1", r, snw), nil},
		{"an unpublishing claim still holds the volume", []string{snw},
			[]*CSIVolumeClaim{{AllocationID: "a1", NodeID: "n1", Mode: w, AccessMode: snw, State: CSIVolumeClaimStateUnpublishing}},
			claim("a2", "n2", w, snw), ErrCSIMaxClaims},
		{"a claim's own earlier record does not count", []string{snw},
			[]*CSIVolumeClaim{claim("a1", "n1", w, snw)}, claim("a1", "n1", w, snw), nil},
		{"single-node-reader refuses writes", []string{snr}, nil, claim("a1", "n1", w, snr), ErrInvalidRequest},
		{"multi-node-reader admits readers on many nodes", []string{mnr},
			[]*CSIVolumeClaim{claim("a1", "n1", r, mnr), claim("a2", "n2", r, mnr)}, claim("a3", "n3", r, mnr), nil},
		{"multi-node-reader refuses writes", []string{mnr}, nil, claim("a1", "n1", w, mnr), ErrInvalidRequest},
		{"multi-node-single-writer admits one writer and many readers", []string{mns},
			[]*CSIVolumeClaim{claim("a1", "n1", w, mns), claim("a2", "n2", r, mns)}, claim("a3", "n3", r, mns), nil},
		{"multi-node-single-writer refuses a second writer", []string{mns},
			[]*CSIVolumeClaim{claim("a1", "n1", w, mns)}, claim("a2", "n2", w, mns), ErrCSIMaxClaims},
		{"multi-node-multi-writer admits many writers", []string{mnm},
			[]*CSIVolumeClaim{claim("a1", "n1", w, mnm), claim("a2", "n2", w, mnm)}, claim("a3", "n3", w, mnm), nil},
		{"a mode the volume was not registered with", []string{snw}, nil, claim("a1", "n1", r, mnr), ErrInvalidRequest},
		{"a bad claim mode", []string{mnm}, nil, claim("a1", "n1", "rw", mnm), ErrInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := vol(tc.modes...)
			for _, c := range tc.existing {
				v.Claims[c.AllocationID] = c
			}
			before := v.Copy()
			err := v.CanClaim(tc.claim)
			if tc.wantErr == nil {
				must.NoError(t, err)
			} else {
				must.ErrorIs(t, err, tc.wantErr)
			}
			must.Eq(t, before, v, must.Sprint("CanClaim changes nothing"))
		})
	}
}

func TestCSIVolume_SanitizeDropsSecrets(t *testing.T) {
	v := &CSIVolume{ID: "v", Secrets: map[string]string{"token": "s3cret"}, Claims: map[string]*CSIVolumeClaim{
		"a": {AllocationID: "a", PublishContext: map[string]string{"device": "/dev/x"}},
	}}
	s := v.Sanitize()
	must.Nil(t, s.Secrets)
	must.Eq(t, "s3cret", v.Secrets["token"])
	s.Claims["a"].PublishContext["device"] = "changed"
	must.Eq(t, "/dev/x", v.Claims["a"].PublishContext["device"])
}
