package structs

import "time"

// CSIControllerCallMax is the longest one destructive controller call may
// run: the servers' lane gives up on it then, and a client's own deadline
// for the call (client.Config.CSIControllerCallTimeout) may not exceed it.
// A recorded fence on a node that went down holds this long after it went
// down (plus CSIFenceDownMargin), since a call sent there may run that
// long.
const CSIControllerCallMax = 2 * time.Minute

// CSIFenceDownMargin covers what separates a node's recorded down time
// from the calls it was sent: the time is kept in whole seconds, the
// servers' clocks differ a little, and a call may leave the leader just
// as the node is declared down.
const CSIFenceDownMargin = 10 * time.Second

// CSIControllerFence records, in Raft, the node whose controller instance
// of a plugin the leader last sent a destructive call to. A new leader
// cannot know whether that call is still running there (the old leader
// may have been cut off or paused mid-call), so it keeps the plugin's
// destructive calls on that node — whose client lane queues them behind
// the earlier one — until a call there succeeds (the lane is idle), or the
// node is gone or has been down for longer than CSIControllerCallMax.
type CSIControllerFence struct {
	PluginID string
	NodeID   string

	CreateIndex uint64
	ModifyIndex uint64
}

// CSIControllerFenceRequest writes a plugin's fence.
type CSIControllerFenceRequest struct {
	Fence CSIControllerFence
}
