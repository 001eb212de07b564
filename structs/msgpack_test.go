package structs

import (
	"runtime"
	"testing"

	"github.com/shoenig/test/must"
)

// TestMsgpackHandle_NestedDeclaredLengths decodes maps nested 500 deep,
// each declaring 2^32-1 entries and holding one: what the decoder
// reserves for a declared length adds up over the levels, so it must be
// small per level. With 1<<16 entries reserved per map this input of
// 3.5 KB allocated 2.5 GB.
func TestMsgpackHandle_NestedDeclaredLengths(t *testing.T) {
	const depth = 500
	var in []byte
	for range depth {
		in = append(in, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a')
	}
	in = append(in, 0xc0)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var out any
	err := Decode(in, &out)
	runtime.ReadMemStats(&after)

	must.Error(t, err) // the declared entries never come
	allocated := after.TotalAlloc - before.TotalAlloc
	must.Less(t, uint64(16<<20), allocated,
		must.Sprintf("decoding %d bytes of nested map headers allocated %d bytes", len(in), allocated))
}
