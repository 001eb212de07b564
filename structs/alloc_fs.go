package structs

import "time"

// Operations of an AllocFSRequest, as Nomad's /v1/client/fs routes.
const (
	AllocFSList = "ls"
	AllocFSStat = "stat"
	AllocFSCat  = "cat"
)

// MaxAllocFSEntries bounds the entries one listing returns.
const MaxAllocFSEntries = 10000

// AllocFSRequest reads the allocation's directory (Alloc.FS on a server,
// ClientAllocs.FS on its node): Path relative to it; for cat, a piece
// from Offset of at most Limit bytes (0 or more than MaxLogChunk:
// MaxLogChunk).
type AllocFSRequest struct {
	AllocID string
	Op      string
	Path    string
	Offset  int64
	Limit   int
	QueryOptions
}

// AllocFSResponse answers it: Files for ls, File for stat, Data, Offset
// and the file's Size for cat.
type AllocFSResponse struct {
	Files  []*AllocFileInfo
	File   *AllocFileInfo
	Data   []byte
	Offset int64
	Size   int64
}

// AllocFileInfo is a file of an allocation directory, in Nomad's shape.
type AllocFileInfo struct {
	Name        string
	IsDir       bool
	Size        int64
	FileMode    string
	ModTime     time.Time
	ContentType string `json:",omitempty"`
}
