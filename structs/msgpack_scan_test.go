package structs

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"
	"math/rand"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/shoenig/test/must"
)

func encodeMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	var buf []byte
	must.NoError(t, codec.NewEncoderBytes(&buf, MsgpackHandle).Encode(v))
	return buf
}

// ReadMsgpackValue reads exactly one value, whatever its types, and leaves
// the reader at the next one.
func TestReadMsgpackValue_RoundTrip(t *testing.T) {
	job := &Job{ID: "web", Meta: map[string]string{"a": strings.Repeat("x", 70000)},
		TaskGroups: []*TaskGroup{{Name: "g", Count: 3, Tasks: []*Task{{
			Name: "t", Config: map[string]any{"command": "/bin/true", "n": int64(-1 << 40), "f": 1.5, "b": true,
				"l": []any{uint64(1 << 63), int8(-3), nil, []byte{1, 2}}},
			KillTimeout: time.Second,
		}}}},
		SubmitTime: time.Now().UnixNano(),
	}
	values := []any{
		job, 1, -1, 300, -300, 70000, -70000, int64(1) << 40, "", strings.Repeat("s", 40),
		strings.Repeat("s", 300), strings.Repeat("s", 70000), []byte(strings.Repeat("b", 300)),
		[]int{}, make([]int, 20), make([]int, 70000), map[string]int{}, map[string]int{"a": 1},
		float32(1.5), 2.5, nil, true, false, time.Now(),
	}
	var (
		stream  []byte
		encoded [][]byte
	)
	for _, v := range values {
		encoded = append(encoded, encodeMsgpack(t, v))
		stream = append(stream, encoded[len(encoded)-1]...)
	}
	stream = append(stream, 0x01)
	r := bufio.NewReader(bytes.NewReader(stream))
	for i := range values {
		got, err := ReadMsgpackValue(r, nil, DefaultMsgpackMaxContainers, 1<<20)
		must.NoError(t, err, must.Sprint(i))
		must.Eq(t, encoded[i], got, must.Sprint(i))
	}
	b, err := r.ReadByte()
	must.NoError(t, err)
	must.Eq(t, byte(0x01), b)
	_, err = ReadMsgpackValue(r, nil, DefaultMsgpackMaxContainers, 1<<20)
	must.ErrorIs(t, err, io.EOF)
}

// Four million empty task groups are refused after the limit's worth of
// them, having allocated little more than the bytes read.
func TestReadMsgpackValue_ContainerLimit(t *testing.T) {
	const groups = 4_000_000
	frame := concat(
		[]byte{0x81, 0xa3}, []byte("Job"),
		[]byte{0x81, 0xaa}, []byte("TaskGroups"),
		[]byte{0xdd, 0x00, 0x3d, 0x09, 0x00}, // array32 of 4,000,000
		bytes.Repeat([]byte{0x80}, groups),
	)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ReadMsgpackValue(bufio.NewReader(bytes.NewReader(frame)), nil, 1000, len(frame))
	runtime.ReadMemStats(&after)
	must.ErrorIs(t, err, ErrInvalidRequest)
	must.ErrorIs(t, err, errMsgpackTooComplex)
	must.StrContains(t, err.Error(), "more than 1000 maps and arrays")
	must.Less(t, uint64(1<<20), after.TotalAlloc-before.TotalAlloc)

	_, err = ReadMsgpackValue(bufio.NewReader(bytes.NewReader(frame)), nil, groups+3, len(frame))
	must.NoError(t, err)

	deep := append(bytes.Repeat([]byte{0x91}, MsgpackMaxDepth+1), 0x01)
	_, err = ReadMsgpackValue(bufio.NewReader(bytes.NewReader(deep)), nil, DefaultMsgpackMaxContainers, len(deep))
	must.ErrorContains(t, err, "nested deeper than 1024")
}

// A declared length is not allocated before its bytes arrive, and one
// that cannot fit in what may still come fails at once, without waiting
// for bytes that are not sent.
func TestReadMsgpackValue_HugeDeclaredLengths(t *testing.T) {
	huge := []byte{0xff, 0xff, 0xff, 0xff}
	for _, m := range []byte{0xc6, 0xc9, 0xdb, 0xdd, 0xdf} {
		in := append(append([]byte{m}, huge...), 0x01, 0x02)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := ReadMsgpackValue(bufio.NewReader(bytes.NewReader(in)), nil, DefaultMsgpackMaxContainers, math.MaxInt)
		runtime.ReadMemStats(&after)
		must.ErrorIs(t, err, io.ErrUnexpectedEOF, must.Sprintf("0x%02x", m))
		must.Less(t, uint64(1<<20), after.TotalAlloc-before.TotalAlloc, must.Sprintf("0x%02x", m))

		// A reader that never ends: only the length check can stop it.
		_, err = ReadMsgpackValue(bufio.NewReader(io.MultiReader(bytes.NewReader(in), endless{})), nil, DefaultMsgpackMaxContainers, 4<<20)
		must.ErrorIs(t, err, ErrInvalidRequest, must.Sprintf("0x%02x", m))
		must.ErrorIs(t, err, errMsgpackTooLarge, must.Sprintf("0x%02x", m))
	}
	// Lengths that fit are read.
	v := encodeMsgpack(t, strings.Repeat("x", 1000))
	_, err := ReadMsgpackValue(bufio.NewReader(bytes.NewReader(v)), nil, 1, len(v))
	must.NoError(t, err)
	_, err = ReadMsgpackValue(bufio.NewReader(bytes.NewReader(v)), nil, 1, len(v)-1)
	must.ErrorIs(t, err, errMsgpackTooLarge)
}

// endless reads as zero bytes forever.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// No first byte and no following bytes make it panic or read more than
// one value's worth.
func TestReadMsgpackValue_AnyBytes(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for first := 0; first < 256; first++ {
		for i := 0; i < 50; i++ {
			in := make([]byte, 1+r.Intn(64))
			r.Read(in)
			in[0] = byte(first)
			got, err := ReadMsgpackValue(bufio.NewReader(bytes.NewReader(in)), nil, 8, 1<<20)
			if err != nil {
				must.True(t, errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrInvalidRequest) || errors.Is(err, io.EOF), must.Sprint(err))
				continue
			}
			must.Eq(t, in[:len(got)], got)
		}
	}
}

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
