package agent

import (
	"bytes"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
)

// fuzzMaxInput skips inputs the fuzzer grew past what a test input
// needs: the HCL parser takes seconds on 100 KB of nested expressions.
const fuzzMaxInput = 64 << 10

// fuzzMaxNesting skips input nested deeper than this: hclsyntax recurses
// once per bracket and a deep enough input overflows the goroutine stack,
// a fatal error the fuzzer cannot report. ParseConfig has no nesting
// limit of its own yet; once it refuses deep input before it parses,
// this guard goes.
const fuzzMaxNesting = 1000

func tooDeep(src []byte) bool {
	depth := 0
	for _, b := range src {
		switch b {
		case '{', '[', '(':
			depth++
			if depth > fuzzMaxNesting {
				return true
			}
		case '}', ']', ')':
			if depth > 0 {
				depth--
			}
		}
	}
	return false
}

// FuzzParseConfig parses agent config files. An error names what is
// wrong and comes without a config. A config merges onto the defaults
// (and onto the dev defaults) and validates without panicking; every
// duration it accepted parses, as the agent later assumes; one that
// validates maps onto a client configuration.
func FuzzParseConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > fuzzMaxInput || tooDeep(src) {
			t.Skip()
		}
		c, err := ParseConfig("fuzz.hcl", src)
		if err != nil {
			must.Nil(t, c, must.Sprintf("a config came with the error %v", err))
			must.NotEq(t, "", err.Error(), must.Sprint("an error with no message"))
			return
		}
		must.NotNil(t, c)
		again, err := ParseConfig("fuzz.hcl", src)
		must.NoError(t, err)
		must.Eq(t, c, again)

		// ParseConfig checks these; setupServer and clientConfig then read
		// them with parseDurationOr, which falls back to the default on a
		// bad one instead of failing.
		var durations []string
		if s := c.Server; s != nil {
			durations = append(durations, s.HeartbeatGrace, s.MinHeartbeatTTL,
				s.FailoverHeartbeatTTL, s.LeaveDrainTimeout, s.CSINodeDetachTimeout)
			if j := s.ServerJoin; j != nil {
				durations = append(durations, j.RetryInterval)
			}
		}
		if cl := c.Client; cl != nil {
			durations = append(durations, cl.CSINodeCallTimeout)
		}
		for _, d := range durations {
			if d == "" {
				continue
			}
			v, err := time.ParseDuration(d)
			must.NoError(t, err, must.Sprintf("accepted duration %q does not parse", d))
			must.NonNegative(t, v, must.Sprintf("accepted duration %q", d))
		}

		for _, base := range []*Config{DefaultConfig(), DevConfig()} {
			merged := base.Merge(c)
			if merged.DataDir == "" {
				merged.DataDir = "/var/lib/roam-fuzz"
			}
			if err := merged.Validate(); err != nil {
				continue
			}
			must.NotNil(t, merged.Limits)
			for _, d := range []string{merged.Limits.RPCHandshakeTimeout, merged.Limits.RPCFrameTimeout, merged.Limits.HTTPBodyReadTimeout} {
				v, err := time.ParseDuration(d)
				must.NoError(t, err, must.Sprintf("validated limit %q does not parse", d))
				must.Positive(t, v, must.Sprintf("validated limit %q", d))
			}
			a := &Agent{config: merged, logger: hclog.NewNullLogger()}
			cc, err := a.clientConfig("127.0.0.1:4646")
			if err != nil {
				continue
			}
			if len(cc.Servers) == 0 {
				cc.Servers = []string{"127.0.0.1:4647"}
			}
			_ = cc.Validate()
		}
	})
}

func TestTooDeep(t *testing.T) {
	must.True(t, tooDeep(bytes.Repeat([]byte("{"), fuzzMaxNesting+1)))
	must.False(t, tooDeep(bytes.Repeat([]byte("{}"), 10*fuzzMaxNesting)))
}
