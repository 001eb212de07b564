package hostpath

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// destructiveMethods are the controller calls a storage provider may not be
// able to run concurrently, keyed by gRPC full method name.
var destructiveMethods = map[string]string{
	"/csi.v1.Controller/CreateVolume":              "CreateVolume",
	"/csi.v1.Controller/DeleteVolume":              "DeleteVolume",
	"/csi.v1.Controller/ControllerPublishVolume":   "ControllerPublishVolume",
	"/csi.v1.Controller/ControllerUnpublishVolume": "ControllerUnpublishVolume",
	"/csi.v1.Controller/ControllerExpandVolume":    "ControllerExpandVolume",
	"/csi.v1.Controller/CreateSnapshot":            "CreateSnapshot",
	"/csi.v1.Controller/DeleteSnapshot":            "DeleteSnapshot",
}

// OverlapsFile is the path of the overlap count file of the plugin with
// nodeID in stateDir. It holds a decimal count and a newline.
func OverlapsFile(stateDir, nodeID string) string {
	return filepath.Join(stateDir, "overlaps-"+nodeID)
}

// CallsFile is the path of the destructive-call counts of the plugin with
// nodeID in stateDir: a JSON object from method name to count.
func CallsFile(stateDir, nodeID string) string {
	return filepath.Join(stateDir, "calls-"+nodeID+".json")
}

// ReadOverlaps reads the overlap count recorded by the plugin with nodeID in
// stateDir. A missing file reads as zero.
func ReadOverlaps(stateDir, nodeID string) (int64, error) {
	buf, err := os.ReadFile(OverlapsFile(stateDir, nodeID))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading overlap count: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(buf)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing overlap count: %w", err)
	}
	return n, nil
}

// ReadCalls reads the destructive-call counts recorded by the plugin with
// nodeID in stateDir. A missing file reads as no calls.
func ReadCalls(stateDir, nodeID string) (map[string]int64, error) {
	calls := map[string]int64{}
	buf, err := os.ReadFile(CallsFile(stateDir, nodeID))
	if errors.Is(err, os.ErrNotExist) {
		return calls, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading call counts: %w", err)
	}
	if err := json.Unmarshal(buf, &calls); err != nil {
		return nil, fmt.Errorf("parsing call counts: %w", err)
	}
	return calls, nil
}

// overlapTracker counts destructive controller calls in flight and how often
// one started while another was running, and mirrors the counts to files.
type overlapTracker struct {
	logger                  hclog.Logger
	overlapsPath, callsPath string

	inFlight atomic.Int64
	overlaps atomic.Int64
	// provider is the record shared by every instance on the state dir.
	provider *providerRecord

	// mu guards calls and serialises file writes, so a file never goes
	// backwards.
	mu    sync.Mutex
	calls map[string]int64
}

// newOverlapTracker starts from the counts already in the files, so that a
// restarted plugin does not erase the evidence of an earlier overlap, and
// writes both files.
func newOverlapTracker(stateDir, nodeID string, logger hclog.Logger) (*overlapTracker, error) {
	overlaps, err := ReadOverlaps(stateDir, nodeID)
	if err != nil {
		return nil, err
	}
	calls, err := ReadCalls(stateDir, nodeID)
	if err != nil {
		return nil, err
	}
	t := &overlapTracker{
		logger:       logger,
		overlapsPath: OverlapsFile(stateDir, nodeID),
		callsPath:    CallsFile(stateDir, nodeID),
		calls:        calls,
		provider:     newProviderRecord(stateDir, nodeID),
	}
	t.overlaps.Store(overlaps)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.writeOverlapsLocked(); err != nil {
		return nil, err
	}
	if err := t.writeCallsLocked(); err != nil {
		return nil, err
	}
	if overlaps > 0 {
		logger.Warn("earlier overlapping destructive controller calls recorded", "overlaps", overlaps)
	}
	return t, nil
}

// start records the start of a destructive call and returns the function
// that records its end.
func (t *overlapTracker) start(method string) (done func()) {
	inFlight := t.inFlight.Add(1)
	var overlaps int64
	if inFlight > 1 {
		overlaps = t.overlaps.Add(1)
	}
	t.mu.Lock()
	t.calls[method]++
	err := t.writeCallsLocked()
	if inFlight > 1 {
		err = errors.Join(err, t.writeOverlapsLocked())
	}
	t.mu.Unlock()
	if inFlight > 1 {
		t.logger.Warn("overlapping destructive controller call",
			"method", method, "in_flight", inFlight, "overlaps", overlaps)
	}
	if err != nil {
		t.logger.Error("failed to record controller call", "method", method, "error", err)
	}
	others, providerDone, perr := t.provider.start(method)
	if perr != nil {
		t.logger.Error("failed to record controller call in the provider record", "method", method, "error", perr)
	}
	if len(others) > 0 {
		t.logger.Warn("destructive controller calls in flight at once at the provider",
			"method", method, "others_in_flight", fmt.Sprintf("%+v", others))
	}
	return func() {
		providerDone()
		t.inFlight.Add(-1)
	}
}

// writeOverlapsLocked writes the overlap count, durably: it is the evidence
// of a broken promise, and rare. t.mu must be held.
func (t *overlapTracker) writeOverlapsLocked() error {
	overlaps := strconv.FormatInt(t.overlaps.Load(), 10) + "\n"
	if err := writeFileAtomic(t.overlapsPath, []byte(overlaps), true); err != nil {
		return fmt.Errorf("writing overlap count: %w", err)
	}
	return nil
}

// writeCallsLocked writes the call counts on every destructive call. They
// are a record for tests, not the provider's state, so they are replaced
// atomically but not fsynced: four fsyncs per call would make the record
// cost more than the simulated provider, and serialise plugins that share
// a disk. t.mu must be held.
func (t *overlapTracker) writeCallsLocked() error {
	buf, err := json.Marshal(t.calls)
	if err != nil {
		return fmt.Errorf("encoding call counts: %w", err)
	}
	if err := writeFileAtomic(t.callsPath, append(buf, '\n'), false); err != nil {
		return fmt.Errorf("writing call counts: %w", err)
	}
	return nil
}

func (t *overlapTracker) overlapCount() int64 { return t.overlaps.Load() }

func (t *overlapTracker) callCounts() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.calls)
}
