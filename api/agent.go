package api

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
