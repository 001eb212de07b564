package structs

import "time"

// ServerMember is one server as this cluster's membership sees it.
type ServerMember struct {
	ID         string
	Name       string
	Addr       string // RPC address, host:port
	Region     string
	Datacenter string
	// Status is "alive" while the server answers, "failed" once it stops.
	Status string
	// Leader is set on the member that currently leads.
	Leader bool
	// Voter reports whether the server is a Raft voter.
	Voter bool
	Tags  map[string]string
}

// Member statuses.
const (
	MemberAlive  = "alive"
	MemberFailed = "failed"
	MemberLeft   = "left"
)

// ServerMembersResponse lists the servers.
type ServerMembersResponse struct {
	ServerName   string
	ServerRegion string
	ServerDC     string
	Members      []*ServerMember
}

// ServerJoinRequest is sent by a server to another to announce itself and
// learn what that server knows.
type ServerJoinRequest struct {
	Member ServerMember
	// HasState tells the peer whether the sender already belongs to a Raft
	// configuration (it must not be bootstrapped again).
	HasState bool
	// ClusterID is the cluster the sender's Raft state belongs to, if it
	// knows one.
	ClusterID string
	WriteRequest
}

// ServerJoinResponse carries the peer's view of the cluster.
type ServerJoinResponse struct {
	Self     ServerMember
	HasState bool
	// LeaderAddr is the leader's RPC address if the peer knows it.
	LeaderAddr string
	// ClusterID is the cluster the peer's Raft state belongs to, if known.
	ClusterID string
	Members   []*ServerMember
}

// RaftServer is one entry of the Raft configuration.
type RaftServer struct {
	ID           string
	Node         string
	Address      string
	Leader       bool
	Voter        bool
	RaftProtocol string
	// Healthy is set for the answering server and for peers it heard
	// from within the member fail time.
	Healthy bool
	// LastContact is how long ago the answering server last heard from
	// the peer (0 for itself; -1 if never).
	LastContact time.Duration
}

// RaftConfigurationResponse is the Raft configuration with the index it was
// read at.
type RaftConfigurationResponse struct {
	Servers []*RaftServer
	Index   uint64
}

// RaftPeerRequest names a Raft peer by ID or by address.
type RaftPeerRequest struct {
	ID      string
	Address string
	WriteRequest
}

// TransferLeadershipRequest asks the leader to hand over. An empty target
// lets the leader pick an up-to-date voter.
type TransferLeadershipRequest struct {
	PeerID      string
	PeerAddress string
	WriteRequest
}

// TransferLeadershipResponse names the new leader.
type TransferLeadershipResponse struct {
	NewLeaderID   string
	NewLeaderAddr string
}

// StatusPingResponse is empty; a reply means the server is up.
type StatusPingResponse struct{}

// SnapshotSaveRequest asks the leader to take a snapshot of all state and
// hold the file for SnapshotRead.
type SnapshotSaveRequest struct {
	WriteRequest
}

// SnapshotSaveResponse names the held file.
type SnapshotSaveResponse struct {
	ID    string
	Size  int64
	Index uint64
	Term  uint64
}

// SnapshotChunkRequest reads the held file ID from Offset.
type SnapshotChunkRequest struct {
	ID     string
	Offset int64
	WriteRequest
}

// SnapshotChunkResponse is one piece of a held file; Done is set on the
// last, after which the leader forgets the file.
type SnapshotChunkResponse struct {
	Data []byte
	Done bool
}

// SnapshotUploadRequest sends one piece of a snapshot file to the leader,
// at Offset of the upload ID (empty ID and Offset 0 start a new upload).
type SnapshotUploadRequest struct {
	ID     string
	Offset int64
	Data   []byte
	WriteRequest
}

// SnapshotUploadResponse names the upload and how much of it arrived.
type SnapshotUploadResponse struct {
	ID       string
	Received int64
}

// SnapshotRestoreRequest restores the uploaded file ID through Raft.
type SnapshotRestoreRequest struct {
	ID string
	WriteRequest
}

// SnapshotRestoreResponse reports what was restored: the snapshot's own
// index and term, the Raft index the restore was written at, and the
// objects per table.
type SnapshotRestoreResponse struct {
	Index         uint64
	Term          uint64
	RestoredIndex uint64
	Counts        map[string]int
}

// AgentProfileMetrics is the AgentProfileRequest.Kind that asks for the
// server's metrics (the JSON of /v1/metrics) instead of a profile.
const AgentProfileMetrics = "metrics"

// AgentProfileRequest asks a server for one of its Go runtime profiles
// (internal/profile) or its metrics: what /v1/agent/pprof/ and `roam
// operator debug` collect from every server.
type AgentProfileRequest struct {
	// ServerID names the server: its ID, "leader", or empty for the one
	// called.
	ServerID string
	// Kind is profile.CPU, profile.Trace, one of profile.Named, or
	// AgentProfileMetrics.
	Kind    string
	Seconds int
	Debug   int
	GC      bool
	// Forwarded marks a call one server passed on to the one named: it is
	// answered there or refused, never passed on again.
	Forwarded bool
	QueryOptions
}

// CallTimeout bounds the call: the profile's own length, and time to
// pass it on and send it back (see RPCCallTimeout).
func (r AgentProfileRequest) CallTimeout() time.Duration {
	return time.Duration(max(r.Seconds, 0))*time.Second + 30*time.Second
}

// AgentProfileResponse is the profile, and the server that took it.
type AgentProfileResponse struct {
	ServerID   string
	ServerName string
	Payload    []byte
}
