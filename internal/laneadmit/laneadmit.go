// Package laneadmit decides which queued controller calls of one CSI
// plugin's lane may start, given the calls already running there.
//
// A plugin that accepts more than one destructive controller call at a time
// (its controller_concurrency) still must never see two calls on one volume
// at once, nor two publish/unpublish calls for one target node: attaching
// two volumes to one host at once is where providers race (the EBS
// device-name race). Admit is the whole rule, with no clock and no I/O, so
// the server's lanes and the client's share it and it is tested as a table.
//
// The rule, in queue order: a call starts when a slot is free and neither
// its volume nor its node is held by a running call or by a call queued
// ahead of it. A call that cannot start still holds its keys against the
// calls behind it, so calls for one volume, and for one node, start in the
// order they arrived; a call whose keys are free starts ahead of older
// calls that wait for theirs (no head-of-line blocking). None starves: the
// oldest queued call waits only for running calls, and every call queued
// behind it that shares a key waits for it.
package laneadmit

// Call is what admission knows of one controller call.
type Call struct {
	// Volume is the volume the call acts on; empty for none.
	Volume string
	// Source is a second volume key the call holds: the snapshot or volume
	// a create copies from; empty for none.
	Source string
	// Node is the target node of a publish or unpublish; empty for every
	// other call.
	Node string
}

// Keys a caller builds, so that both lanes name one thing alike and a
// provider's volume ID, a new volume's name and a snapshot ID never meet
// by chance.

// VolumeKey is the key of the volume with external (provider) ID id.
func VolumeKey(id string) string { return "vol:" + id }

// NameKey is the key of a volume being created under name.
func NameKey(name string) string { return "name:" + name }

// SnapshotKey is the key of the snapshot with provider ID id.
func SnapshotKey(id string) string { return "snap:" + id }

// Create is the call that creates a volume under name, from the snapshot
// snapshotID or as a clone of the volume cloneID (at most one set): it
// holds the new name and its source.
func Create(name, snapshotID, cloneID string) Call {
	c := Call{Volume: NameKey(name)}
	switch {
	case snapshotID != "":
		c.Source = SnapshotKey(snapshotID)
	case cloneID != "":
		c.Source = VolumeKey(cloneID)
	}
	return c
}

// MinLimit and MaxLimit bound a plugin's controller_concurrency.
const (
	MinLimit = 1
	MaxLimit = 64
)

// Admit returns the indexes, ascending, of the calls in queue that may
// start now, given the calls running and the lane's limit. A limit below
// MinLimit counts as MinLimit. Running may already exceed the limit (the
// limit fell); then nothing starts.
func Admit(running, queue []Call, limit int) []int {
	if limit < MinLimit {
		limit = MinLimit
	}
	free := limit - len(running)
	if free <= 0 || len(queue) == 0 {
		return nil
	}
	held := newKeys(len(running) + len(queue))
	for _, c := range running {
		held.take(c)
	}
	var start []int
	for i, c := range queue {
		if !held.holds(c) {
			start = append(start, i)
			if free--; free == 0 {
				break
			}
		}
		// Started or not, the call's keys are now taken: behind it, calls
		// for its volume or node wait their turn.
		held.take(c)
	}
	return start
}

// keys are the volumes and nodes taken so far in one admission.
type keys struct {
	volumes map[string]struct{}
	nodes   map[string]struct{}
}

func newKeys(n int) keys {
	return keys{volumes: make(map[string]struct{}, n), nodes: make(map[string]struct{}, n)}
}

func (k keys) take(c Call) {
	if c.Volume != "" {
		k.volumes[c.Volume] = struct{}{}
	}
	if c.Source != "" {
		k.volumes[c.Source] = struct{}{}
	}
	if c.Node != "" {
		k.nodes[c.Node] = struct{}{}
	}
}

func (k keys) holds(c Call) bool {
	if _, ok := k.volumes[c.Volume]; ok && c.Volume != "" {
		return true
	}
	if _, ok := k.volumes[c.Source]; ok && c.Source != "" {
		return true
	}
	_, ok := k.nodes[c.Node]
	return ok && c.Node != ""
}

// Valid reports whether n is a controller_concurrency a plugin may ask for.
func Valid(n int) bool { return n >= MinLimit && n <= MaxLimit }
