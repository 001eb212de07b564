package jobspec

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"

	"github.com/roamhq/roam/api"
	"github.com/roamhq/roam/structs"
)

// fuzzMaxInput skips inputs the fuzzer grew past what a test input
// needs: the HCL parser takes seconds on 100 KB of nested expressions,
// which would stall a worker without finding anything new.
const fuzzMaxInput = 64 << 10

// FuzzParseHCL parses job files. An error must be an invalid-request
// error and come without a job; a job must be valid, reach the server
// unchanged through msgpack, and take the path `roam job run` sends it
// on (its JSON, through the API client's types, into ParseJSON) without
// being refused or changed.
func FuzzParseHCL(f *testing.F) {
	f.Add([]byte(fullHCL))
	f.Fuzz(func(t *testing.T, src []byte) {
		// Deep nesting is not skipped: ParseHCL refuses it before the
		// parser can recurse, and the check below wants that refusal.
		if len(src) > fuzzMaxInput {
			t.Skip()
		}
		job, err := ParseHCL("fuzz.hcl", src)
		if err != nil {
			if !errors.Is(err, structs.ErrInvalidRequest) {
				t.Fatalf("error does not wrap ErrInvalidRequest: %v", err)
			}
			if job != nil {
				t.Fatalf("a job came with the error %v", err)
			}
			return
		}
		checkParsedJob(t, job)

		// As readJobFile and the API client send it.
		buf, err := json.Marshal(job)
		if err != nil {
			t.Fatalf("encode parsed job as JSON: %v", err)
		}
		var apiJob api.Job
		if err := json.Unmarshal(buf, &apiJob); err != nil {
			t.Fatalf("decode parsed job into api.Job: %v", err)
		}
		body, err := json.Marshal(&api.JobRegisterRequest{Job: &apiJob})
		if err != nil {
			t.Fatalf("encode register request: %v", err)
		}
		fromJSON, err := ParseJSON(body)
		if err != nil {
			t.Fatalf("the server refuses a job file the CLI accepts: %v\nbody: %s", err, body)
		}
		if a, b := canonicalMsgpack(t, job), canonicalMsgpack(t, fromJSON); !bytes.Equal(a, b) {
			t.Fatalf("the job changed on its way through JSON:\nhcl:  %#v\njson: %#v", job, fromJSON)
		}
	})
}

// FuzzParseJSON parses API job JSON, as the HTTP API receives it. An
// error must be an invalid-request error and come without a job; a job
// must be valid, reach the server unchanged through msgpack, and parse
// to the same job again from its own JSON (which is the API's).
func FuzzParseJSON(f *testing.F) {
	for _, typ := range []string{structs.JobTypeService, structs.JobTypeBatch, structs.JobTypeSystem} {
		buf, err := json.Marshal(map[string]any{"Job": nomadJob(typ, 2, nil)})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(buf)
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > fuzzMaxInput {
			t.Skip()
		}
		job, err := ParseJSON(src)
		if err != nil {
			if !errors.Is(err, structs.ErrInvalidRequest) {
				t.Fatalf("error does not wrap ErrInvalidRequest: %v", err)
			}
			if job != nil {
				t.Fatalf("a job came with the error %v", err)
			}
			return
		}
		checkParsedJob(t, job)

		buf, err := json.Marshal(job)
		if err != nil {
			t.Fatalf("encode parsed job as JSON: %v", err)
		}
		again, err := ParseJSON(buf)
		if err != nil {
			t.Fatalf("a parsed job's own JSON is refused: %v\njson: %s", err, buf)
		}
		if a, b := canonicalMsgpack(t, job), canonicalMsgpack(t, again); !bytes.Equal(a, b) {
			t.Fatalf("the job changed when parsed from its own JSON:\nfirst:  %#v\nsecond: %#v", job, again)
		}
	})
}

// checkParsedJob checks what holds for any job a parser returns: it is
// valid, defaulting it again changes nothing, and what the server
// decodes from its msgpack encoding is the same job, still valid.
func checkParsedJob(t *testing.T, job *structs.Job) {
	t.Helper()
	if job == nil {
		t.Fatal("no job and no error")
	}
	if err := job.Validate(); err != nil {
		t.Fatalf("a parsed job does not validate: %v", err)
	}
	enc := canonicalMsgpack(t, job)
	var decoded structs.Job
	if err := codec.NewDecoderBytes(enc, structs.MsgpackHandle).Decode(&decoded); err != nil {
		t.Fatalf("decode the job's msgpack encoding: %v", err)
	}
	if err := decoded.Validate(); err != nil {
		t.Fatalf("the job the server decodes does not validate: %v", err)
	}
	decoded.Canonicalize()
	if again := canonicalMsgpack(t, &decoded); !bytes.Equal(enc, again) {
		t.Fatalf("the job changed through msgpack and Canonicalize:\nsent:     %#v\ndecoded:  %#v", job, &decoded)
	}
}

// canonicalHandle is structs.MsgpackHandle with map keys sorted, so that
// equal jobs encode to equal bytes: a comparison that sees past the Go
// types the decoder chose for numbers in a driver config.
var canonicalHandle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{}
	h.RawToString = true
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.Canonical = true
	return h
}()

func canonicalMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	var out []byte
	if err := codec.NewEncoderBytes(&out, canonicalHandle).Encode(v); err != nil {
		t.Fatalf("msgpack encode: %v", err)
	}
	return out
}
