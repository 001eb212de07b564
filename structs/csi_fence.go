package structs

// CSIControllerFence records, in Raft, the node whose controller instance
// of a plugin the leader last sent a destructive call to. A new leader
// cannot know whether that call is still running there (the old leader
// may have been cut off or paused mid-call), so it keeps the plugin's
// destructive calls on that node — whose client lane queues them behind
// the earlier one — until a call there succeeds (the lane is idle) or the
// node is down.
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
