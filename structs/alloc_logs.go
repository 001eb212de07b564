package structs

// MaxLogChunk bounds the bytes of a log one AllocLogsResponse carries; a
// longer log is read in several calls.
const MaxLogChunk = 256 << 10

// AllocLogsRequest asks for a piece of a task's log (Alloc.Logs on a
// server, ClientAllocs.Logs on the allocation's node). Stream is "stdout"
// or "stderr"; Origin "start" counts Offset from the log's beginning,
// "end" back from its end.
type AllocLogsRequest struct {
	AllocID string
	Task    string
	Stream  string
	Origin  string
	Offset  int64
	// Limit bounds the bytes returned; 0 or more than MaxLogChunk means
	// MaxLogChunk.
	Limit int
	QueryOptions
}

// AllocLogsResponse is a piece of a log.
type AllocLogsResponse struct {
	Data []byte
	// Offset is where Data starts, counted from the log's beginning.
	Offset int64
	// Size is the log's size when this piece was read.
	Size int64
}
