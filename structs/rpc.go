package structs

// Protocol bytes: the first byte of every connection to a server's RPC port,
// and of every yamux stream inside a client session, picks what follows.
const (
	// RPCNomad is msgpack RPC (net/rpc framing).
	RPCNomad byte = 0x01
	// RPCRaft is Raft's own transport.
	RPCRaft byte = 0x02
	// RPCMultiplex is a yamux session; each stream starts with its own byte.
	RPCMultiplex byte = 0x03
	// RPCTLS wraps one of the others in TLS.
	RPCTLS byte = 0x04
)
