package structs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Decoding msgpack can cost far more memory than the bytes it reads: an
// empty map is one byte, and decoded into a *TaskGroup or an *Allocation
// it is a struct of a hundred bytes or more. A 4 MB frame of four million
// empty task groups once took 2.3 GB. ReadMsgpackValue reads one value's
// bytes without decoding them, counting maps and arrays, so that a frame
// asking for too many is refused before anything is built from it.

// DefaultMsgpackMaxContainers bounds the maps and arrays of one RPC
// request: about 50 MB of decoded structs at worst, and far more than a
// job at the default limits (a few thousand) or a client's batch of
// allocation updates (about twenty per allocation) needs.
const DefaultMsgpackMaxContainers = 1 << 17

// MsgpackMaxDepth bounds the nesting of one value, as the codec's own
// default does.
const MsgpackMaxDepth = 1024

// errMsgpackTooComplex means a msgpack value holds more maps and arrays,
// or nests deeper, than allowed. It is returned wrapped in
// ErrInvalidRequest.
var errMsgpackTooComplex = errors.New("msgpack value too complex")

// errMsgpackTooLarge means a msgpack value declares more bytes or values
// than may follow. It is returned wrapped in ErrInvalidRequest.
var errMsgpackTooLarge = errors.New("msgpack value too large")

// MsgpackReader is what ReadMsgpackValue reads from.
type MsgpackReader interface {
	io.Reader
	io.ByteReader
}

// ReadMsgpackValue reads exactly one msgpack value from r, appends its
// bytes to buf and returns the result. It fails, wrapping
// ErrInvalidRequest, once the value holds more than maxContainers maps and
// arrays (nested ones included), nests deeper than MsgpackMaxDepth, or
// declares a length that cannot fit in maxBytes (a string of 4 GiB, or
// more array elements than bytes left), without waiting for those bytes.
// It does not recurse and allocates nothing in proportion to the lengths
// the value declares, only to the bytes it actually reads.
func ReadMsgpackValue(r MsgpackReader, buf []byte, maxContainers, maxBytes int) ([]byte, error) {
	start := len(buf)
	// fits reports whether n more bytes can still come.
	fits := func(n uint64) error {
		if left := uint64(max(maxBytes-(len(buf)-start), 0)); n > left {
			return fmt.Errorf("%w: %w: a length of %d is more than the %d bytes left of %d", ErrInvalidRequest, errMsgpackTooLarge, n, left, maxBytes)
		}
		return nil
	}
	// pending[i] is how many values the i-th open container still holds;
	// the outermost entry is the one value asked for.
	pending := []uint64{1}
	containers := 0
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--

		b, err := r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) && containers > 0 {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
		buf = append(buf, b)
		var (
			lenBytes int    // bytes of length that follow the marker
			extra    uint64 // fixed bytes after the length (ext type, payload)
			elems    uint64 // values a container holds, per length unit
			isCont   bool
		)
		switch {
		case b <= 0x7f, b >= 0xe0, b == 0xc0, b == 0xc2, b == 0xc3:
			continue // fixint, nil, bool
		case b >= 0x80 && b <= 0x8f:
			if err := push(&pending, &containers, maxContainers, 2*uint64(b&0x0f)); err != nil {
				return buf, err
			}
			continue
		case b >= 0x90 && b <= 0x9f:
			if err := push(&pending, &containers, maxContainers, uint64(b&0x0f)); err != nil {
				return buf, err
			}
			continue
		case b >= 0xa0 && b <= 0xbf:
			if err := fits(uint64(b & 0x1f)); err != nil {
				return buf, err
			}
			buf, err = readN(r, buf, uint64(b&0x1f))
			if err != nil {
				return buf, err
			}
			continue
		}
		switch b {
		case 0xc4, 0xd9: // bin8, str8
			lenBytes = 1
		case 0xc5, 0xda: // bin16, str16
			lenBytes = 2
		case 0xc6, 0xdb: // bin32, str32
			lenBytes = 4
		case 0xc7: // ext8
			lenBytes, extra = 1, 1
		case 0xc8: // ext16
			lenBytes, extra = 2, 1
		case 0xc9: // ext32
			lenBytes, extra = 4, 1
		case 0xca, 0xce, 0xd2: // float32, uint32, int32
			extra = 4
		case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
			extra = 8
		case 0xcc, 0xd0: // uint8, int8
			extra = 1
		case 0xcd, 0xd1: // uint16, int16
			extra = 2
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16
			extra = 1 + 1<<(b-0xd4)
		case 0xdc: // array16
			lenBytes, elems, isCont = 2, 1, true
		case 0xdd: // array32
			lenBytes, elems, isCont = 4, 1, true
		case 0xde: // map16
			lenBytes, elems, isCont = 2, 2, true
		case 0xdf: // map32
			lenBytes, elems, isCont = 4, 2, true
		default: // 0xc1 is never used
			return buf, fmt.Errorf("%w: msgpack: invalid marker 0x%02x", ErrInvalidRequest, b)
		}
		var n uint64
		if lenBytes > 0 {
			at := len(buf)
			if buf, err = readN(r, buf, uint64(lenBytes)); err != nil {
				return buf, err
			}
			switch lenBytes {
			case 1:
				n = uint64(buf[at])
			case 2:
				n = uint64(binary.BigEndian.Uint16(buf[at:]))
			case 4:
				n = uint64(binary.BigEndian.Uint32(buf[at:]))
			}
		}
		if isCont {
			// Every value is at least one byte.
			if err := fits(elems * n); err != nil {
				return buf, err
			}
			if err := push(&pending, &containers, maxContainers, elems*n); err != nil {
				return buf, err
			}
			continue
		}
		if err := fits(n + extra); err != nil {
			return buf, err
		}
		if buf, err = readN(r, buf, n+extra); err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// IsMsgpackTooLarge reports whether err is ReadMsgpackValue's refusal of
// a length that cannot fit in the bytes allowed.
func IsMsgpackTooLarge(err error) bool { return errors.Is(err, errMsgpackTooLarge) }

// push opens a container of n values.
func push(pending *[]uint64, containers *int, maxContainers int, n uint64) error {
	*containers++
	if *containers > maxContainers {
		return fmt.Errorf("%w: %w: more than %d maps and arrays", ErrInvalidRequest, errMsgpackTooComplex, maxContainers)
	}
	if len(*pending) > MsgpackMaxDepth {
		return fmt.Errorf("%w: %w: nested deeper than %d", ErrInvalidRequest, errMsgpackTooComplex, MsgpackMaxDepth)
	}
	*pending = append(*pending, n)
	return nil
}

// readN appends n bytes from r to buf, growing buf only as bytes arrive,
// so that a declared length is never allocated up front.
func readN(r io.Reader, buf []byte, n uint64) ([]byte, error) {
	const chunk = 32 << 10
	for n > 0 {
		step := min(n, chunk)
		start := len(buf)
		buf = append(buf, make([]byte, step)...)
		if _, err := io.ReadFull(r, buf[start:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return buf[:start], err
		}
		n -= step
	}
	return buf, nil
}
