package nomad

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/rpc"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/jobspec"
	"github.com/roamhq/roam/structs"
)

// fuzzFrameBytes is the frame limit of the fuzzed server: small, so that
// inputs the fuzzer can grow to cross it and the limit's path is covered.
const fuzzFrameBytes = 8 << 10

// fuzzConnWait bounds how long the server may take to end a connection,
// and everything the connection started, after its peer hung up.
const fuzzConnWait = 10 * time.Second

// fuzzAllocPerByte and fuzzAllocSlack bound what one input may make the
// server allocate: linear in the bytes it was sent. Decoding into the
// server's structs legitimately allocates a few hundred bytes per input
// byte (an empty map, one byte, becomes a whole struct); a declared length
// that reserves memory the input does not back costs gigabytes.
const (
	fuzzAllocPerByte = 4096
	fuzzAllocSlack   = 32 << 20
)

// FuzzRPCConn feeds each input, as a whole connection, to the server's
// connection handler: the first byte picks msgpack RPC, Raft, a yamux
// session or TLS as on the real port, and the rest is what the peer sent
// before it hung up. Every input must end with the server closing the
// connection within fuzzConnWait, every goroutine it started gone, and
// its allocations linear in its length (so a frame cannot make the
// decoders reserve memory beyond the frame limit).
func FuzzRPCConn(f *testing.F) {
	for _, seed := range rpcConnSeeds(f) {
		f.Add(seed)
	}
	s := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		serveFuzzConn(t, s, in)
	})
}

// serveFuzzConn serves in as one connection to s and checks that the
// server ends it, and all it started, within fuzzConnWait, having
// allocated no more than the bound. It returns the connection, to see
// what the server sent.
func serveFuzzConn(t testing.TB, s *Server, in []byte) *fuzzConn {
	before := runtime.NumGoroutine()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)

	conn := newFuzzConn(in)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		s.handleConn(conn, nil, connPeer{})
	}()
	deadline := time.NewTimer(fuzzConnWait)
	defer deadline.Stop()
	select {
	case <-returned:
	case <-deadline.C:
		t.Fatalf("connection handler still running %s after the peer hung up", fuzzConnWait)
	}
	// Raft's transport serves its connections on its own goroutines.
	select {
	case <-conn.closed:
	case <-deadline.C:
		t.Fatalf("server did not close the connection within %s of the peer hanging up", fuzzConnWait)
	}
	// Streams of a session, and Raft's connection handler, end after the
	// connection closes; wait for them before counting.
	for n := runtime.NumGoroutine(); n > before; n = runtime.NumGoroutine() {
		select {
		case <-deadline.C:
			t.Fatalf("%d goroutines still running %s after the peer hung up", n-before, fuzzConnWait)
		case <-time.After(time.Millisecond):
		}
	}

	runtime.ReadMemStats(&m1)
	alloc := m1.TotalAlloc - m0.TotalAlloc
	if limit := uint64(fuzzAllocPerByte*len(in) + fuzzAllocSlack); alloc > limit {
		t.Fatalf("serving %d bytes allocated %d bytes, over the bound of %d", len(in), alloc, limit)
	}
	return conn
}

// fuzzServer returns a server whose connection handling, codecs and
// endpoints are real but whose Raft and background work are stopped, so
// that an input reaches every decoder a connection can reach and still
// cannot write to Raft, block for minutes, or leave work that the next
// input would see. Its endpoints answer as a server that is shutting
// down: a write fails before it is validated, a stale read is answered.
// Connections that start with RPCRaft go to a Raft network transport
// whose consumer refuses every command, so that Raft's own decoder reads
// them.
func fuzzServer(f testing.TB) *Server {
	c := TestConfig(f)
	c.DevMode = true
	c.DataDir = ""
	c.Logger = hclog.NewNullLogger()
	c.RPCMaxFrameBytes = fuzzFrameBytes
	s, err := NewServer(c)
	must.NoError(f, err)
	must.NoError(f, s.Shutdown(context.Background()))

	s.raftLayer = newRaftLayer(advertiseAddr(s.advertise), "", nil)
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  s.raftLayer,
		MaxPool: 1,
		Timeout: time.Second,
		Logger:  hclog.NewNullLogger(),
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case r := <-trans.Consumer():
				r.Respond(nil, errors.New("fuzz: raft is not running"))
			case <-stop:
				return
			}
		}
	})
	f.Cleanup(func() {
		_ = trans.Close()
		close(stop)
		wg.Wait()
	})
	return s
}

// fuzzConn is the server's side of a connection whose peer sent in and
// hung up: reads return in, then io.EOF; writes are discarded until Close.
type fuzzConn struct {
	mu     sync.Mutex
	r      *bytes.Reader
	once   sync.Once
	closed chan struct{}
	// written counts what the server sent back.
	written atomic.Int64
}

func newFuzzConn(in []byte) *fuzzConn {
	return &fuzzConn{r: bytes.NewReader(in), closed: make(chan struct{})}
}

func (c *fuzzConn) Read(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.Read(p)
}

func (c *fuzzConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	c.written.Add(int64(len(p)))
	return len(p), nil
}

func (c *fuzzConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *fuzzConn) LocalAddr() net.Addr              { return advertiseAddr("127.0.0.1:4647") }
func (c *fuzzConn) RemoteAddr() net.Addr             { return advertiseAddr("127.0.0.2:40000") }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

var _ net.Conn = (*fuzzConn)(nil)

// rpcConnSeeds are whole connections under every first byte: well-formed
// calls of each kind, and the broken and hostile shapes that tests and
// reports have used.
func rpcConnSeeds(tb testing.TB) [][]byte {
	job, err := jobspec.ParseHCL("seed.hcl", []byte(`job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["10"]
      }
    }
  }
}`))
	must.NoError(tb, err)
	node := &structs.Node{
		ID: "8f1cd5a2-0f5e-4a43-9e3c-2b7f6b1c0d11", SecretID: "b3d9b3e2-5b8a-4c55-8f8e-2ad1f1b5e0a7",
		Name: "n1", Datacenter: "dc1", Status: structs.NodeStatusReady,
		Attributes: map[string]string{"kernel.name": "linux"},
	}
	vol := &structs.CSIVolume{
		ID: "vol-1", Name: "vol-1", ExternalID: "ext-1", PluginID: "hostpath",
		RequestedCapabilities: []*structs.CSIVolumeCapability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
	}
	stale := structs.QueryOptions{AllowStale: true, MinQueryIndex: 1 << 40, MaxQueryTime: time.Minute}

	call := func(seq uint64, method string, body any) []byte {
		return rpcFrame(tb, seq, method, body)
	}
	ping := call(1, "Status.Ping", &structs.GenericRequest{})
	register := call(2, "Job.Register", &structs.JobRegisterRequest{Job: job})
	nested := nestedMapBody(tb, "No.Such", 200)

	nomadSeeds := [][]byte{
		ping,
		call(1, "Status.Leader", &structs.GenericRequest{}),
		call(1, "Status.Members", &structs.GenericRequest{QueryOptions: stale}),
		register,
		call(1, "Job.List", &structs.JobListRequest{QueryOptions: stale}),
		call(1, "Job.GetJob", &structs.JobSpecificRequest{JobID: "web", QueryOptions: stale}),
		call(1, "Node.Register", &structs.NodeRegisterRequest{Node: node}),
		call(1, "Node.UpdateStatus", &structs.NodeUpdateStatusRequest{NodeID: node.ID, Status: structs.NodeStatusDown}),
		call(1, "Node.GetClientAllocs", &structs.NodeSpecificRequest{NodeID: node.ID, QueryOptions: stale}),
		call(1, "Alloc.List", &structs.AllocListRequest{QueryOptions: stale}),
		call(1, "Eval.List", &structs.EvalListRequest{QueryOptions: stale}),
		call(1, "CSIVolume.Register", &structs.CSIVolumeRegisterRequest{Volumes: []*structs.CSIVolume{vol}}),
		call(1, "CSIVolume.List", &structs.CSIVolumeListRequest{QueryOptions: stale}),
		call(1, "CSIPlugin.List", &structs.CSIPluginListRequest{QueryOptions: stale}),
		call(1, "Operator.RaftGetConfiguration", &structs.GenericRequest{QueryOptions: stale}),
		call(1, "Status.Join", &structs.ServerJoinRequest{Member: structs.ServerMember{ID: "s2", Addr: "127.0.0.3:4647", Region: "global"}}),
		call(1, "ClientRPC.Forward", &structs.ClientRPCForwardRequest{NodeID: node.ID, Method: "ClientStatus.Ping", Args: []byte{0x80}}),
		call(1, "Status.HasNodeConn", &structs.NodeSpecificRequest{NodeID: node.ID}),
		call(1, "No.Such", map[string]any{"a": []any{1, "b", map[string]any{}}}),
		call(1, "Malformed", nil),
		concatBytes(ping, register, call(3, "Status.Ping", &structs.GenericRequest{})),
		register[:len(register)/2],
		// Over the frame limit, in a string the decoder must read through.
		call(1, "Job.Register", &structs.JobRegisterRequest{Job: &structs.Job{ID: string(bytes.Repeat([]byte{'x'}, 2*fuzzFrameBytes))}}),
		nested,
		nestedConfigRegister(tb, 200),
		msgpackSeed(tb, map[string]any{"ServiceMethod": 42, "Seq": "not a number"}),
		{0xdf, 0xff, 0xff, 0xff, 0xff},
		{0xdd, 0xff, 0xff, 0xff, 0xff},
		{0xdb, 0xff, 0xff, 0xff, 0xff},
	}

	appendEntries := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("s2"), Addr: []byte("127.0.0.3:4647")},
		Term:      3, PrevLogEntry: 4, PrevLogTerm: 2, LeaderCommitIndex: 4,
		Entries: []*raft.Log{{Index: 5, Term: 3, Type: raft.LogCommand, Data: append([]byte{byte(structs.JobRegisterRequestType)}, 0x80)}},
	}
	heartbeat := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("s2"), Addr: []byte("127.0.0.3:4647")},
		Term:      3,
	}
	raftSeeds := [][]byte{
		raftFrame(tb, 0, appendEntries),
		raftFrame(tb, 0, heartbeat),
		raftFrame(tb, 1, &raft.RequestVoteRequest{Term: 9, LastLogIndex: 100, LastLogTerm: 8}),
		raftFrame(tb, 4, &raft.RequestPreVoteRequest{Term: 9, LastLogIndex: 100, LastLogTerm: 8}),
		append(raftFrame(tb, 2, &raft.InstallSnapshotRequest{Term: 9, LastLogIndex: 100, Size: 16}), bytes.Repeat([]byte{0x80}, 16)...),
		raftFrame(tb, 2, &raft.InstallSnapshotRequest{Term: 9, Size: 1 << 40}),
		raftFrame(tb, 3, &raft.TimeoutNowRequest{}),
		concatBytes(raftFrame(tb, 0, heartbeat), raftFrame(tb, 0, appendEntries)),
		{9, 0x80},
		{0, 0xdf, 0xff, 0xff, 0xff, 0xff},
	}

	yamuxSeeds := [][]byte{
		yamuxStream(1, append([]byte{structs.RPCNomad}, ping...)),
		concatBytes(yamuxStream(1, append([]byte{structs.RPCNomad}, ping...)), yamuxStream(3, append([]byte{structs.RPCNomad}, register...))),
		yamuxStream(1, append([]byte{structs.RPCRaft}, raftFrame(tb, 1, &raft.RequestVoteRequest{Term: 9})...)),
		yamuxStream(1, []byte{structs.RPCMultiplex}),
		yamuxStream(1, []byte{structs.RPCTLS, 0x16, 0x03, 0x01}),
		yamuxStream(1, append([]byte{structs.RPCNomad}, nested...)),
		yamuxStream(2, append([]byte{structs.RPCNomad}, ping...)),
		yamuxHeader(2, 0, 0, 7),              // ping
		yamuxHeader(3, 0, 0, 0),              // go away
		yamuxHeader(0, 0, 9, 1<<31),          // data for a stream never opened
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, // unknown version
		yamuxHeader(1, 1, 1, 1<<31),          // window update too large
	}

	seeds := [][]byte{
		{},
		{0x00}, {0x05}, {0xff},
		[]byte("GET / HTTP/1.1\r\nHost: roam\r\n\r\n"),
		{0x16, 0x03, 0x01, 0x00, 0x05},
		{structs.RPCTLS, 0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00},
		{structs.RPCNomad}, {structs.RPCRaft}, {structs.RPCMultiplex}, {structs.RPCTLS},
	}
	for _, s := range nomadSeeds {
		seeds = append(seeds, append([]byte{structs.RPCNomad}, s...))
	}
	for _, s := range raftSeeds {
		seeds = append(seeds, append([]byte{structs.RPCRaft}, s...))
	}
	for _, s := range yamuxSeeds {
		seeds = append(seeds, append([]byte{structs.RPCMultiplex}, s...))
	}
	return seeds
}

// rpcFrame is one msgpack RPC request, as the client codec writes it.
func rpcFrame(tb testing.TB, seq uint64, method string, body any) []byte {
	return msgpackSeed(tb, &rpc.Request{ServiceMethod: method, Seq: seq}, body)
}

// nestedMaps is depth maps, each declaring 2^32-1 entries and holding
// only the next: a few bytes per level that a decoder which believes
// declared lengths turns into megabytes per level.
func nestedMaps(depth int) []byte {
	var out []byte
	for range depth {
		out = append(out, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a')
	}
	return append(out, 0xc0)
}

// nestedMapBody is a request for method whose body is nestedMaps. For an
// unknown method the server decodes it into an empty interface to skip it.
func nestedMapBody(tb testing.TB, method string, depth int) []byte {
	return append(msgpackSeed(tb, &rpc.Request{ServiceMethod: method, Seq: 1}), nestedMaps(depth)...)
}

// nestedConfigRegister is a Job.Register whose one task's driver config
// is nestedMaps: the config is a map[string]any, decoded as it comes.
func nestedConfigRegister(tb testing.TB, depth int) []byte {
	out := msgpackSeed(tb, &rpc.Request{ServiceMethod: "Job.Register", Seq: 1})
	str := func(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }
	out = concatBytes(out,
		[]byte{0x81}, str("Job"), []byte{0x81}, str("TaskGroups"), []byte{0x91},
		[]byte{0x81}, str("Tasks"), []byte{0x91}, []byte{0x81}, str("Config"))
	return append(out, nestedMaps(depth)...)
}

func msgpackSeed(tb testing.TB, vals ...any) []byte {
	var buf bytes.Buffer
	enc := codec.NewEncoder(&buf, structs.MsgpackHandle)
	for _, v := range vals {
		must.NoError(tb, enc.Encode(v))
	}
	return buf.Bytes()
}

// raftFrame is one command on a Raft connection, as raft's network
// transport writes it: the RPC type, then the msgpack request.
func raftFrame(tb testing.TB, rpcType byte, req any) []byte {
	var buf bytes.Buffer
	buf.WriteByte(rpcType)
	must.NoError(tb, codec.NewEncoder(&buf, &codec.MsgpackHandle{}).Encode(req))
	return buf.Bytes()
}

// yamuxHeader is a yamux frame header: version 0, type, flags, stream ID
// and length (the window delta, ping ID or data length).
func yamuxHeader(typ byte, flags uint16, stream, length uint32) []byte {
	h := make([]byte, 12)
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:], flags)
	binary.BigEndian.PutUint32(h[4:], stream)
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

// yamuxStream opens a stream as a client does (a window update with SYN),
// sends data on it and half-closes it.
func yamuxStream(id uint32, data []byte) []byte {
	const (
		typeData, typeWindowUpdate = 0, 1
		flagSYN, flagFIN           = 1, 4
	)
	return concatBytes(
		yamuxHeader(typeWindowUpdate, flagSYN, id, 0),
		yamuxHeader(typeData, 0, id, uint32(len(data))), data,
		yamuxHeader(typeData, flagFIN, id, 0),
	)
}

// TestFuzzRPCConn_SeedsReachDecoders checks that the seeds get past the
// first byte: a seed the server answers was decoded whole, so mutations
// of it start from inside the decoders rather than at their door.
func TestFuzzRPCConn_SeedsReachDecoders(t *testing.T) {
	s := fuzzServer(t)
	ping := rpcFrame(t, 1, "Status.Ping", &structs.GenericRequest{})
	vote := raftFrame(t, 1, &raft.RequestVoteRequest{Term: 9})
	// A session's answers race its end: the server closes a session
	// whose connection reached EOF, so only its decoding is certain.
	answered := map[string][]byte{
		"msgpack rpc": append([]byte{structs.RPCNomad}, ping...),
		"raft":        append([]byte{structs.RPCRaft}, vote...),
	}
	for name, in := range answered {
		t.Run(name, func(t *testing.T) {
			conn := serveFuzzConn(t, s, in)
			must.Positive(t, conn.written.Load(), must.Sprint("the server sent no answer"))
		})
	}
	for _, in := range rpcConnSeeds(t) {
		serveFuzzConn(t, s, in)
	}
}
