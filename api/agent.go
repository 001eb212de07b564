package api

import (
	"net/url"
	"strconv"
)

// Agent reads the agent the client talks to.
type Agent struct{ c *Client }

// Agent returns a handle on the agent endpoints.
func (c *Client) Agent() *Agent { return &Agent{c} }

// AgentSelf is the agent's configuration, its member entry, and stats
// grouped by subsystem ("nomad", "raft", "client", "runtime").
type AgentSelf struct {
	Config map[string]any               `json:"config"`
	Member AgentMember                  `json:"member"`
	Stats  map[string]map[string]string `json:"stats"`
}

// AgentMember is one server. Addr and Port are its RPC address. Tags hold
// "role", "region", "dc", "id", "leader", "voter", "raft_vsn" and, where
// known, "build".
type AgentMember struct {
	Name   string
	Addr   string
	Port   uint16
	Tags   map[string]string
	Status string
}

// ServerMembers are the servers the agent knows.
type ServerMembers struct {
	ServerName   string
	ServerRegion string
	ServerDC     string
	Members      []*AgentMember
}

// Self describes the agent.
func (a *Agent) Self() (*AgentSelf, error) {
	var out AgentSelf
	if _, err := a.c.query("/v1/agent/self", &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Members lists the servers.
func (a *Agent) Members() (*ServerMembers, error) {
	var out ServerMembers
	if _, err := a.c.query("/v1/agent/members", &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// PprofOptions are a profile's parameters. ServerID names the server to
// profile (its ID, or "leader"); empty, the agent called. Seconds is the
// length of a CPU profile or a trace; Debug asks a named profile for text
// (1, or 2 for every goroutine's stack in full); GC collects garbage
// before a heap profile.
type PprofOptions struct {
	ServerID string
	Seconds  int
	Debug    int
	GC       bool
}

func (o PprofOptions) params() url.Values {
	v := url.Values{}
	if o.ServerID != "" {
		v.Set("server_id", o.ServerID)
	}
	if o.Seconds != 0 {
		v.Set("seconds", strconv.Itoa(o.Seconds))
	}
	if o.Debug != 0 {
		v.Set("debug", strconv.Itoa(o.Debug))
	}
	if o.GC {
		v.Set("gc", "true")
	}
	return v
}

// CPUProfile takes a CPU profile over opts.Seconds, in pprof's format.
func (a *Agent) CPUProfile(opts PprofOptions, q *QueryOptions) ([]byte, error) {
	return a.Lookup("profile", opts, q)
}

// Trace takes an execution trace over opts.Seconds (go tool trace).
func (a *Agent) Trace(opts PprofOptions, q *QueryOptions) ([]byte, error) {
	return a.Lookup("trace", opts, q)
}

// Lookup takes a named profile: goroutine, heap, allocs, threadcreate,
// block or mutex (or profile and trace).
func (a *Agent) Lookup(profile string, opts PprofOptions, q *QueryOptions) ([]byte, error) {
	body, _, err := a.c.rawQuery("/v1/agent/pprof/"+url.PathEscape(profile), opts.params(), q)
	return body, err
}

// ServerMetrics returns the JSON metrics summary of the server serverID
// names (its ID, or "leader").
func (a *Agent) ServerMetrics(serverID string, q *QueryOptions) ([]byte, error) {
	body, _, err := a.c.rawQuery("/v1/metrics", url.Values{"server_id": {serverID}}, q)
	return body, err
}
