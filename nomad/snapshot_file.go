package nomad

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// A snapshot file, as `roam operator snapshot save` writes it:
//
//	magic    8 bytes  "ROAMSNAP"
//	version  2 bytes  big-endian, snapshotFileVersion
//	hdrLen   4 bytes  big-endian length of the header
//	header   hdrLen bytes of JSON (SnapshotHeader)
//	body     header.Size bytes: the FSM's snapshot stream
//	sum      32 bytes: SHA-256 of every byte before it
//
// The checksum covers the header too, so neither the index nor the counts
// can be edited without the file being refused.

const (
	snapshotMagic = "ROAMSNAP"
	// snapshotFileVersion versions the file's framing (magic, header,
	// checksum); the body, the FSM's stream, carries its own
	// snapshotFormatVersion.
	snapshotFileVersion = 1
	// maxSnapshotHeader bounds the JSON header; a real one is a few
	// hundred bytes.
	maxSnapshotHeader = 64 << 10
	snapshotPrefixLen = len(snapshotMagic) + 2 + 4
)

// DefaultSnapshotMaxBytes bounds a snapshot file that a server accepts for
// restore, and that inspect reads.
const DefaultSnapshotMaxBytes int64 = 1 << 30

var (
	// ErrSnapshotCorrupt is returned for a file that is not a snapshot,
	// or whose checksum, header or contents do not agree.
	ErrSnapshotCorrupt = errors.New("snapshot file is corrupt")
	// ErrSnapshotTruncated is returned for a file shorter than its header
	// says it is.
	ErrSnapshotTruncated = errors.New("snapshot file is truncated")
	// ErrSnapshotTooLarge is returned for a file over the size limit.
	ErrSnapshotTooLarge = errors.New("snapshot file is too large")
)

// SnapshotHeader describes a snapshot file.
type SnapshotHeader struct {
	// Version is the file format's version.
	Version int
	// Index and Term are those of the last Raft entry the state includes.
	Index uint64
	Term  uint64
	// RaftVersion is the Raft snapshot version of the body.
	RaftVersion int
	// Region is the region of the cluster the snapshot was taken from.
	Region string
	// CreatedAt is when the snapshot was taken (UTC).
	CreatedAt time.Time
	// Size is the body's length in bytes.
	Size int64
	// Counts are the objects per table in the body.
	Counts map[string]int
	// SHA256 is the hex checksum of the whole file before the checksum,
	// filled in by ReadSnapshotFile for display.
	SHA256 string `json:",omitempty"`
}

// encodeSnapshotFile builds a snapshot file from its header and body. The
// header's Size and Version are set here.
func encodeSnapshotFile(hdr *SnapshotHeader, body []byte) ([]byte, error) {
	h := *hdr
	h.Version = snapshotFileVersion
	h.Size = int64(len(body))
	h.SHA256 = ""
	hj, err := json.Marshal(&h)
	if err != nil {
		return nil, fmt.Errorf("snapshot: encode header: %w", err)
	}
	if len(hj) > maxSnapshotHeader {
		return nil, fmt.Errorf("snapshot: header of %d bytes exceeds %d", len(hj), maxSnapshotHeader)
	}
	var buf bytes.Buffer
	buf.Grow(snapshotPrefixLen + len(hj) + len(body) + sha256.Size)
	buf.WriteString(snapshotMagic)
	_ = binary.Write(&buf, binary.BigEndian, uint16(snapshotFileVersion))
	_ = binary.Write(&buf, binary.BigEndian, uint32(len(hj)))
	buf.Write(hj)
	buf.Write(body)
	sum := sha256.Sum256(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes(), nil
}

// ReadSnapshotFile reads a whole snapshot file of at most maxBytes, checks
// its checksum, and decodes its body completely (into a throwaway store)
// to check that it restores and that its counts match the header. It
// returns the header and the body. A file that fails any check is refused
// with an error wrapping ErrSnapshotCorrupt, ErrSnapshotTruncated,
// ErrSnapshotTooLarge, or ErrSnapshotNewer for a file (or body) in a
// format newer than this build reads.
func ReadSnapshotFile(r io.Reader, maxBytes int64) (*SnapshotHeader, []byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultSnapshotMaxBytes
	}
	file, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: read: %w", err)
	}
	if int64(len(file)) > maxBytes {
		return nil, nil, fmt.Errorf("%w: more than %d bytes", ErrSnapshotTooLarge, maxBytes)
	}
	return parseSnapshotFile(file)
}

// parseSnapshotFile checks and splits a snapshot file held in memory.
func parseSnapshotFile(file []byte) (*SnapshotHeader, []byte, error) {
	if len(file) < len(snapshotMagic) || string(file[:len(snapshotMagic)]) != snapshotMagic {
		if len(file) < len(snapshotMagic) && bytes.HasPrefix([]byte(snapshotMagic), file) {
			return nil, nil, fmt.Errorf("%w: %d bytes, too short to hold a header", ErrSnapshotTruncated, len(file))
		}
		return nil, nil, fmt.Errorf("%w: not a roam snapshot (bad magic)", ErrSnapshotCorrupt)
	}
	if len(file) < snapshotPrefixLen {
		return nil, nil, fmt.Errorf("%w: %d bytes, too short to hold a header", ErrSnapshotTruncated, len(file))
	}
	version := binary.BigEndian.Uint16(file[8:10])
	if version > snapshotFileVersion {
		// Not damage: a newer build wrote it, and only one reads it.
		return nil, nil, fmt.Errorf("snapshot file format version %d is newer than this build reads (%d): %w",
			version, snapshotFileVersion, ErrSnapshotNewer)
	}
	if version != snapshotFileVersion {
		return nil, nil, fmt.Errorf("%w: file format version %d, this build reads %d", ErrSnapshotCorrupt, version, snapshotFileVersion)
	}
	hdrLen := int64(binary.BigEndian.Uint32(file[10:14]))
	if hdrLen > maxSnapshotHeader {
		return nil, nil, fmt.Errorf("%w: header length %d exceeds %d", ErrSnapshotCorrupt, hdrLen, maxSnapshotHeader)
	}
	if int64(len(file)) < int64(snapshotPrefixLen)+hdrLen {
		return nil, nil, fmt.Errorf("%w: header cut short", ErrSnapshotTruncated)
	}
	var hdr SnapshotHeader
	hdrBytes := file[snapshotPrefixLen : int64(snapshotPrefixLen)+hdrLen]
	if err := json.Unmarshal(hdrBytes, &hdr); err != nil {
		return nil, nil, fmt.Errorf("%w: header: %w", ErrSnapshotCorrupt, err)
	}
	if hdr.Size < 0 {
		return nil, nil, fmt.Errorf("%w: negative body size %d", ErrSnapshotCorrupt, hdr.Size)
	}
	want := int64(snapshotPrefixLen) + hdrLen + hdr.Size + sha256.Size
	switch {
	case int64(len(file)) < want:
		return nil, nil, fmt.Errorf("%w: %d bytes, the header says %d", ErrSnapshotTruncated, len(file), want)
	case int64(len(file)) > want:
		return nil, nil, fmt.Errorf("%w: %d bytes after the checksum", ErrSnapshotCorrupt, int64(len(file))-want)
	}
	end := want - sha256.Size
	sum := sha256.Sum256(file[:end])
	if !bytes.Equal(sum[:], file[end:]) {
		return nil, nil, fmt.Errorf("%w: checksum mismatch (file %x, contents %x)", ErrSnapshotCorrupt, file[end:], sum[:])
	}
	hdr.SHA256 = fmt.Sprintf("%x", sum[:])
	body := file[int64(snapshotPrefixLen)+hdrLen : end]

	// The checksum proves the file is as it was written, not that what
	// was written restores: a restore that fails half-way inside Raft
	// takes the server down, so every object is decoded here first.
	_, counts, err := restoreStore(bytes.NewReader(body))
	if errors.Is(err, ErrSnapshotNewer) {
		return nil, nil, fmt.Errorf("snapshot body: %w", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: body does not decode: %w", ErrSnapshotCorrupt, err)
	}
	for table, n := range counts {
		if hdr.Counts[table] != n {
			return nil, nil, fmt.Errorf("%w: header counts %d %s, body holds %d", ErrSnapshotCorrupt, hdr.Counts[table], table, n)
		}
	}
	return &hdr, body, nil
}
