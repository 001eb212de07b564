package nomad

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// newRaftEncoder encodes as Raft's network transport does.
func newRaftEncoder(w io.Writer) *codec.Encoder {
	h := &codec.MsgpackHandle{}
	h.TimeNotBuiltin = true
	return codec.NewEncoder(w, h)
}

// msgpackValues are values of every msgpack shape, encoded by the codec
// the server and Raft use.
func msgpackValues(t *testing.T) [][]byte {
	t.Helper()
	type inner struct {
		A []byte
		B map[string]any
		C []any
		T time.Time
	}
	vals := []any{
		nil, true, false, 0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32 + 1,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32 - 1, math.MinInt64,
		uint64(math.MaxUint64), float32(1.5), 2.5,
		"", "x", string(bytes.Repeat([]byte("s"), 31)), string(bytes.Repeat([]byte("s"), 32)),
		string(bytes.Repeat([]byte("s"), 300)), string(bytes.Repeat([]byte("s"), 70000)),
		[]byte{}, []byte{1, 2, 3}, bytes.Repeat([]byte{7}, 300), bytes.Repeat([]byte{7}, 70000),
		[]any{}, []any{1, "a", nil}, make([]any, 20), make([]any, 70000),
		map[string]any{}, map[string]any{"a": 1}, map[string]int{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "i": 9, "j": 10, "k": 11, "l": 12, "m": 13, "n": 14, "o": 15, "p": 16},
		inner{A: []byte("abc"), B: map[string]any{"x": []any{1, map[string]any{"y": "z"}}}, C: []any{[]any{[]any{}}}, T: time.Now()},
		&structs.NodeListRequest{QueryOptions: structs.QueryOptions{Region: "global", MinQueryIndex: 7}},
		&raft.AppendEntriesRequest{Term: 3, Entries: []*raft.Log{{Index: 1, Data: []byte("d"), AppendedAt: time.Now()}}},
	}
	var out [][]byte
	for _, v := range vals {
		for _, h := range []codec.Handle{structs.MsgpackHandle, &codec.MsgpackHandle{}} {
			var buf bytes.Buffer
			must.NoError(t, codec.NewEncoder(&buf, h).Encode(v))
			out = append(out, buf.Bytes())
		}
	}
	// Ext values, which the encoders above do not write.
	out = append(out,
		[]byte{0xd4, 1, 0xaa}, []byte{0xd8, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		[]byte{0xc7, 2, 9, 1, 2}, []byte{0xc8, 0, 1, 9, 0}, []byte{0xc9, 0, 0, 0, 0, 9},
		// And the new spec's str8 and bin, whichever the handles write.
		[]byte{0xd9, 2, 'a', 'b'}, []byte{0xc4, 1, 0}, []byte{0xc5, 0, 1, 0}, []byte{0xc6, 0, 0, 0, 1, 0})
	return out
}

func TestMsgpackSkipper_EndsWhereTheValueEnds(t *testing.T) {
	trailer := []byte{0x01, 0x02, 0x03}
	for i, enc := range msgpackValues(t) {
		// All at once, with the next value's bytes behind it.
		var m msgpackSkipper
		m.start()
		n, err := m.feed(append(append([]byte{}, enc...), trailer...))
		must.NoError(t, err)
		must.True(t, m.done(), must.Sprintf("value %d (% x...) not done", i, enc[:min(len(enc), 8)]))
		must.EqOp(t, len(enc), n, must.Sprintf("value %d", i))

		// A byte at a time: done only at the last byte. Values run to
		// 70,000 bytes, so the assertions are reached only on a failure:
		// building their messages for every byte cost seconds under -race.
		m.start()
		for j := range enc {
			if m.done() {
				must.Unreachable(t, must.Sprintf("value %d done after %d of %d bytes", i, j, len(enc)))
			}
			n, err := m.feed(enc[j : j+1])
			if err != nil || n != 1 {
				must.NoError(t, err, must.Sprintf("value %d, byte %d", i, j))
				must.EqOp(t, 1, n, must.Sprintf("value %d, byte %d", i, j))
			}
		}
		must.True(t, m.done(), must.Sprintf("value %d not done after all its bytes", i))
	}

	var m msgpackSkipper
	m.start()
	_, err := m.feed([]byte{0x91, 0xc1})
	must.ErrorIs(t, err, errMsgpackNeverUsed)
}

func TestMsgpackSkipper_DeepNestingCostsNothing(t *testing.T) {
	// A million nested one-element arrays: a recursive decoder would need
	// a million stack frames; the skipper only counts.
	deep := append(bytes.Repeat([]byte{0x91}, 1<<20), 0xc0)
	var m msgpackSkipper
	m.start()
	n, err := m.feed(deep)
	must.NoError(t, err)
	must.EqOp(t, len(deep), n)
	must.True(t, m.done())

	// Huge declared counts saturate rather than wrap.
	m.start()
	_, err = m.feed(bytes.Repeat([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}, 100))
	must.NoError(t, err)
	must.False(t, m.done())
}

// requireFraming feeds stream to s in chunks of the given sizes and checks
// that s is between frames exactly at the given boundaries.
func requireFraming(t *testing.T, s frameScanner, stream []byte, boundaries map[int]bool, chunk func() int) {
	t.Helper()
	for pos := 0; pos < len(stream); {
		n := min(chunk(), len(stream)-pos)
		st, err := s.scan(stream[pos : pos+n])
		must.NoError(t, err)
		pos += n
		must.EqOp(t, !boundaries[pos], st.inFrame, must.Sprintf("at byte %d of %d", pos, len(stream)))
	}
}

func TestRaftScanner_FollowsRealFrames(t *testing.T) {
	snapData := bytes.Repeat([]byte{0xc1}, 3000) // not msgpack: must be skipped raw
	frames := [][]byte{
		raftBytes(t, 0, &raft.AppendEntriesRequest{Term: 1, Leader: []byte("l")}),
		raftBytes(t, 0, &raft.AppendEntriesRequest{Term: 2, Entries: []*raft.Log{
			{Index: 1, Term: 2, Type: raft.LogCommand, Data: bytes.Repeat([]byte("x"), 5000), AppendedAt: time.Now()},
			{Index: 2, Term: 2, Type: raft.LogConfiguration, Data: []byte{0x91, 0xc1}},
		}}),
		raftBytes(t, 1, &raft.RequestVoteRequest{Term: 3, Candidate: []byte("c"), LastLogIndex: 9}),
		append(raftBytes(t, raftRPCInstallSnapshot, &raft.InstallSnapshotRequest{
			Term: 3, Leader: []byte("l"), Size: int64(len(snapData)), Configuration: []byte("cfg"),
		}), snapData...),
		raftBytes(t, raftRPCInstallSnapshot, &raft.InstallSnapshotRequest{Term: 4, Size: 0}),
		raftBytes(t, 3, &raft.TimeoutNowRequest{}),
		raftBytes(t, 4, &raft.RequestPreVoteRequest{Term: 5}),
	}
	var stream []byte
	boundaries := map[int]bool{}
	for _, f := range frames {
		stream = append(stream, f...)
		boundaries[len(stream)] = true
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for name, chunk := range map[string]func() int{
		"byte by byte": func() int { return 1 },
		"7 bytes":      func() int { return 7 },
		"random":       func() int { return 1 + rng.IntN(4096) },
		"all at once":  func() int { return len(stream) },
	} {
		t.Run(name, func(t *testing.T) {
			if name == "all at once" {
				st, err := (&raftScanner{}).scan(stream)
				must.NoError(t, err)
				must.False(t, st.inFrame)
				return
			}
			requireFraming(t, &raftScanner{}, stream, boundaries, chunk)
		})
	}

	t.Run("a snapshot's data earns time by its size", func(t *testing.T) {
		var s raftScanner
		head := raftBytes(t, raftRPCInstallSnapshot, &raft.InstallSnapshotRequest{Size: 10 * raftTimeoutScale})
		st, err := s.scan(head)
		must.NoError(t, err)
		must.True(t, st.inFrame)
		must.True(t, st.restart)
		must.EqOp(t, int64(10), st.scale)
	})
}

func TestYamuxScanner_FollowsFrames(t *testing.T) {
	header := func(typ byte, length uint32) []byte {
		h := []byte{0, typ, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(h[8:], length)
		return h
	}
	frames := [][]byte{
		header(1, 1<<20), // a window update: the length is a value, no payload
		append(header(0, 300), make([]byte, 300)...),
		header(0, 0),
		header(2, 7), // ping
		append(header(0, 1), 9),
		header(3, 0), // go away
	}
	var stream []byte
	boundaries := map[int]bool{}
	for _, f := range frames {
		stream = append(stream, f...)
		boundaries[len(stream)] = true
	}
	for _, size := range []int{1, 5, 13, len(stream)} {
		requireFraming(t, &yamuxScanner{}, stream, boundaries, func() int { return size })
	}
}

func TestScaleTimeout(t *testing.T) {
	must.EqOp(t, time.Second, scaleTimeout(time.Second, 0))
	must.EqOp(t, 5*time.Second, scaleTimeout(time.Second, 5))
	must.EqOp(t, maxFrameDeadline, scaleTimeout(time.Second, math.MaxInt64))
	must.EqOp(t, maxFrameDeadline, scaleTimeout(2*maxFrameDeadline, 1))
}
