// Package nomad is the Roam server: Raft and its FSM, the RPC listener and
// endpoints, forwarding to the leader, cluster formation, and the leader's
// duties — node heartbeat timers, evaluation processing and plan
// application, the volume watcher, the drainer, and the controller lanes
// that serialize destructive CSI controller calls per plugin. The claim
// transitions are decided in the csiclaim sub-package, without I/O; see
// docs/architecture.md for how the parts fit together.
//
// One goroutine, the leadership owner (leadership.go), decides when the
// leader's duties start and stop; Raft's notifications, handoffs, snapshot
// restores and failed duties reach it as messages, and it never waits on
// Raft, an RPC or the duties themselves.
//
// A server normally listens on TCP and carries Raft on its RPC port.
// Config.Listener, Config.Dial and Config.RaftTransport put it on another
// network instead; the unit tests use that to run clusters in memory and
// cut links between servers.
//
// The package keeps Nomad's name for the server so that readers who know
// Nomad find things where they expect them; none of Nomad's code is used.
package nomad
