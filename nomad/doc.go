// Package nomad is the Roam server: Raft and its FSM, the RPC listener and
// endpoints, forwarding to the leader, cluster formation, and the leader's
// duties (heartbeat timers today; the volume watcher, drainer and the
// controller-RPC serializer as their issues land).
//
// The package keeps Nomad's name for the server so that readers who know
// Nomad find things where they expect them; none of Nomad's code is used.
package nomad
