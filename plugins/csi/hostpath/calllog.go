package hostpath

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
)

// DefaultCallLogLimit bounds a call log file: past it, calls are no longer
// recorded. At about 200 bytes a line it holds some 40,000 calls, far more
// than any test makes.
const DefaultCallLogLimit = 8 << 20

// nodeVolumeMethods are the node calls that change what a node sees of a
// volume, keyed by gRPC full method name.
var nodeVolumeMethods = map[string]string{
	"/csi.v1.Node/NodeStageVolume":     "NodeStageVolume",
	"/csi.v1.Node/NodeUnstageVolume":   "NodeUnstageVolume",
	"/csi.v1.Node/NodePublishVolume":   "NodePublishVolume",
	"/csi.v1.Node/NodeUnpublishVolume": "NodeUnpublishVolume",
}

// loggedMethod returns the short name of a call the call log records: a
// destructive controller call or a node volume call.
func loggedMethod(fullMethod string) (string, bool) {
	if m, ok := destructiveMethods[fullMethod]; ok {
		return m, true
	}
	m, ok := nodeVolumeMethods[fullMethod]
	return m, ok
}

// callTarget returns the volume and node a call acts on, for its record.
// Node calls act on this plugin's node, named pluginNode.
func callTarget(fullMethod, pluginNode string, req, resp any) (volumeID, nodeID string) {
	switch r := req.(type) {
	case interface{ GetVolumeId() string }:
		volumeID = r.GetVolumeId()
	case interface{ GetSourceVolumeId() string }:
		volumeID = r.GetSourceVolumeId()
	}
	if r, ok := resp.(*csi.CreateVolumeResponse); ok && volumeID == "" {
		volumeID = r.GetVolume().GetVolumeId()
	}
	if r, ok := req.(interface{ GetNodeId() string }); ok {
		nodeID = r.GetNodeId()
	} else if _, ok := nodeVolumeMethods[fullMethod]; ok {
		nodeID = pluginNode
	}
	return volumeID, nodeID
}

// CallLogFile is the path of the timed call record of the plugin with
// nodeID in stateDir: one JSON CallRecord a line.
func CallLogFile(stateDir, nodeID string) string {
	return filepath.Join(stateDir, "calllog-"+nodeID+".jsonl")
}

// CallRecord is one line of a call log: one call, when it reached the
// plugin and when it answered.
type CallRecord struct {
	// Method is the short method name, e.g. "NodeUnpublishVolume".
	Method string `json:"method"`
	// VolumeID is the volume the call names (for CreateVolume, the one it
	// returned; for CreateSnapshot, its source); "" if none.
	VolumeID string `json:"volume_id"`
	// NodeID is the node the call acts on: the request's node ID for
	// controller publish and unpublish, this plugin's node for node calls,
	// "" otherwise.
	NodeID string `json:"node_id"`
	// StartUnixNano and EndUnixNano are wall-clock times: when the call
	// reached the plugin (before any simulated latency) and when its
	// answer was ready.
	StartUnixNano int64 `json:"start_unix_nano"`
	EndUnixNano   int64 `json:"end_unix_nano"`
	// Error is the gRPC error the call returned, "" on success.
	Error string `json:"error"`
	// Truncated marks the last line of a log that reached its limit: later
	// calls were not recorded. Only that line sets it.
	Truncated bool `json:"truncated,omitempty"`
}

// Start and End are the call's times as time.Time.
func (r CallRecord) Start() time.Time { return time.Unix(0, r.StartUnixNano) }
func (r CallRecord) End() time.Time   { return time.Unix(0, r.EndUnixNano) }

// ReadCallLog reads the call log of the plugin with nodeID in stateDir, in
// the order the calls ended. A missing file reads as no calls. A last line
// without its newline is a record still being written and is left out.
func ReadCallLog(stateDir, nodeID string) ([]CallRecord, error) {
	buf, err := os.ReadFile(CallLogFile(stateDir, nodeID))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading call log: %w", err)
	}
	if i := bytes.LastIndexByte(buf, '\n'); i < len(buf)-1 {
		buf = buf[:i+1]
	}
	var out []CallRecord
	sc := bufio.NewScanner(bytes.NewReader(buf))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var r CallRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("parsing call log line %d: %w", line, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading call log: %w", err)
	}
	return out, nil
}

// callLog appends CallRecords to a file. Every line is one write to a file
// opened with O_APPEND, so processes sharing a node ID (a controller and a
// node plugin) may append to the same file without tearing each other's
// lines. It is a record for tests, not provider state: nothing is fsynced.
type callLog struct {
	logger hclog.Logger
	limit  int64

	// mu guards the fields below and orders this process's lines.
	mu   sync.Mutex
	f    *os.File
	size int64 // bytes in the file as this process last saw it
	full bool  // the truncation marker is written
}

// openCallLog opens (creating if needed) the call log at path for
// appending; a restarted plugin continues the same log.
func openCallLog(path string, limit int64, logger hclog.Logger) (*callLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening call log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("opening call log: %w", err)
	}
	return &callLog{logger: logger, limit: limit, f: f, size: fi.Size()}, nil
}

// record appends r, or the truncation marker if r would take the file past
// its limit. Failures are logged: losing a record must not fail the call.
func (l *callLog) record(r CallRecord) {
	line, err := json.Marshal(r)
	if err != nil {
		l.logger.Error("failed to encode call record", "method", r.Method, "error", err)
		return
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil || l.full {
		return
	}
	if l.size+int64(len(line)) > l.limit {
		l.full = true
		marker, _ := json.Marshal(CallRecord{
			Method: r.Method, StartUnixNano: r.StartUnixNano, EndUnixNano: r.EndUnixNano, Truncated: true,
		})
		line = append(marker, '\n')
		l.logger.Warn("call log reached its limit; later calls are not recorded", "limit_bytes", l.limit)
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	if err != nil {
		l.logger.Error("failed to record call", "method", r.Method, "error", err)
	}
}

// close closes the file; later records are dropped. Safe to call twice.
func (l *callLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	if err != nil {
		return fmt.Errorf("closing call log: %w", err)
	}
	return nil
}
