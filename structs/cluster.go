package structs

// ClusterMetadata identifies a cluster. It lives in Raft state, so a
// snapshot carries it and a restore brings it back: clients compare it to
// tell their own cluster from empty servers that only share its addresses.
type ClusterMetadata struct {
	ClusterID  string
	CreateTime int64 // Unix nanoseconds
}

// ClusterMetadataRequest sets the cluster's metadata once; a cluster that
// already has an ID keeps it.
type ClusterMetadataRequest struct {
	Metadata ClusterMetadata
	WriteRequest
}
