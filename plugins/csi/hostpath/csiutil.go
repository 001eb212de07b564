package hostpath

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// singleNode reports whether an access mode lets only one node attach the
// volume at a time.
func singleNode(mode csi.VolumeCapability_AccessMode_Mode) bool {
	switch mode {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return true
	}
	return false
}

// accessModeName is the name of mode as stored in the state file.
func accessModeName(mode csi.VolumeCapability_AccessMode_Mode) string { return mode.String() }

// singleNodeName reports whether a stored access mode name is single-node.
func singleNodeName(name string) bool {
	return singleNode(csi.VolumeCapability_AccessMode_Mode(csi.VolumeCapability_AccessMode_Mode_value[name]))
}

// checkCapability returns why the plugin cannot serve capability c, or "" if
// it can. Only the mount access type is supported: a volume is a directory.
func checkCapability(c *csi.VolumeCapability) string {
	if c == nil {
		return "volume capability is empty"
	}
	if c.GetBlock() != nil {
		return "block access type is not supported"
	}
	if c.GetMount() == nil {
		return "access type is not set"
	}
	mode := c.GetAccessMode().GetMode()
	if _, ok := csi.VolumeCapability_AccessMode_Mode_name[int32(mode)]; !ok || mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return fmt.Sprintf("access mode %v is not supported", mode)
	}
	return ""
}

// validateCapability returns INVALID_ARGUMENT if the plugin cannot serve c.
func validateCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if why := checkCapability(c); why != "" {
		return status.Error(codes.InvalidArgument, why)
	}
	return nil
}

// page returns the part of a sorted list of n entries that a starting token
// and max entries select, and the token for the next page. Tokens are
// decimal offsets; one that does not parse or points past the end is
// ABORTED, as the spec asks.
func page(n int, token string, maxEntries int32) (start, end int, next string, err error) {
	if maxEntries < 0 {
		return 0, 0, "", status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	if token != "" {
		s, perr := strconv.Atoi(token)
		if perr != nil || s < 0 || s > n {
			return 0, 0, "", status.Errorf(codes.Aborted, "invalid starting token %q", token)
		}
		start = s
	}
	end = n
	if maxEntries > 0 && start+int(maxEntries) < n {
		end = start + int(maxEntries)
		next = strconv.Itoa(end)
	}
	return start, end, next, nil
}

// newID returns prefix followed by 16 random hex digits.
func newID(prefix string) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating ID: %w", err)
	}
	return prefix + hex.EncodeToString(b), nil
}

// delay blocks for d or until ctx ends, in which case it returns the matching
// CANCELLED or DEADLINE_EXCEEDED status.
func delay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}
