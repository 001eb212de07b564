package sim

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestConfig_Validate(t *testing.T) {
	ok := DefaultConfig([]string{"127.0.0.1:4647"})
	must.NoError(t, ok.Validate())
	cases := map[string]func(c *Config){
		"no servers":              func(c *Config) { c.Servers = nil },
		"no nodes":                func(c *Config) { c.Nodes = 0 },
		"too many nodes":          func(c *Config) { c.Nodes = 100_001 },
		"more controllers":        func(c *Config) { c.Controllers = c.Nodes + 1 },
		"no controller":           func(c *Config) { c.Controllers = 0 },
		"no plugin":               func(c *Config) { c.PluginID = "" },
		"too many per address":    func(c *Config) { c.NodesPerAddr = 91 },
		"no room for allocations": func(c *Config) { c.AllocsPerNode = 0 },
		"no registrations":        func(c *Config) { c.RegisterConcurrency = 0 },
		"no call timeout":         func(c *Config) { c.CallTimeout = 0 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c := ok
			mutate(&c)
			must.Error(t, c.Validate())
		})
	}
}

// Nodes dial a loopback server from their own loopback addresses, a few
// nodes to an address; a server elsewhere is dialled from wherever the
// kernel picks.
func TestSourceAddr(t *testing.T) {
	must.Eq(t, "127.100.0.1", sourceAddr("127.0.0.1:4647", 0, 50))
	must.Eq(t, "127.100.0.1", sourceAddr("127.0.0.1:4647", 49, 50))
	must.Eq(t, "127.100.0.2", sourceAddr("127.0.0.1:4647", 50, 50))
	must.Eq(t, "127.100.1.1", sourceAddr("127.0.0.1:4647", 250*50, 50))
	must.Eq(t, "", sourceAddr("10.0.0.1:4647", 7, 50))
	must.Eq(t, "", sourceAddr("not an address", 7, 50))
}

func TestPercentile(t *testing.T) {
	must.Eq(t, 0, percentile(nil, 0.99))
	d := []time.Duration{5, 1, 4, 2, 3}
	must.Eq(t, 3, percentile(d, 0.5))
	must.Eq(t, 4, percentile(d, 0.99))
}

// The provider counts a destructive call that starts while another runs.
func TestProvider_Overlaps(t *testing.T) {
	p := newProvider(0)
	end := p.enter()
	end2 := p.enter()
	end2()
	end()
	must.Eq(t, int64(1), p.overlaps)
	must.Eq(t, 2, p.maxInFlight)
	must.NoError(t, p.publish("v", "n1"))
	must.Error(t, p.publish("v", "n2"), must.Sprint("attached elsewhere"))
	p.unpublish("v", "n1")
	must.NoError(t, p.publish("v", "n2"))
}
