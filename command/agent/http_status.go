package agent

import (
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"

	"github.com/roamhq/roam/client"
	"github.com/roamhq/roam/structs"
)

// statusLeader answers GET /v1/status/leader with the leader's RPC address
// as a JSON string, "" when there is none.
func (s *HTTPServer) statusLeader(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.GenericRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var leader string
	if err := s.rpc(r, "Status.Leader", &args, &leader); err != nil {
		return nil, err
	}
	m := s.localMeta()
	m.KnownLeader = leader != ""
	setMeta(w, m)
	return leader, nil
}

// statusPeers answers GET /v1/status/peers with the Raft voters' addresses.
func (s *HTTPServer) statusPeers(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.GenericRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	var peers []string
	if err := s.rpc(r, "Status.Peers", &args, &peers); err != nil {
		return nil, err
	}
	if peers == nil {
		peers = []string{}
	}
	setMeta(w, s.localMeta())
	return peers, nil
}

// agentMember is a cluster member in the shape of Nomad's api.AgentMember.
// Addr and Port are the server's RPC address; Roam has no gossip layer.
type agentMember struct {
	Name        string
	Addr        string
	Port        uint16
	Tags        map[string]string
	Status      string
	ProtocolMin uint8
	ProtocolMax uint8
	ProtocolCur uint8
	DelegateMin uint8
	DelegateMax uint8
	DelegateCur uint8
}

// serverMembers is the shape of Nomad's api.ServerMembers.
type serverMembers struct {
	ServerName   string
	ServerRegion string
	ServerDC     string
	Members      []*agentMember
}

// agentSelf is the shape of Nomad's api.AgentSelf.
type agentSelf struct {
	Config map[string]any               `json:"config"`
	Member agentMember                  `json:"member"`
	Stats  map[string]map[string]string `json:"stats"`
}

// raftProtocol is the Raft protocol version every Roam server speaks.
const raftProtocol = "3"

// toAgentMember maps a server member to Nomad's member shape. Tags carry
// what Nomad's CLI reads from them (role, region, dc, id, rpc_addr, port,
// build, raft_vsn) plus leader and voter.
func (s *HTTPServer) toAgentMember(m *structs.ServerMember) *agentMember {
	host, portStr, err := net.SplitHostPort(m.Addr)
	if err != nil {
		host = m.Addr
	}
	port, _ := strconv.ParseUint(portStr, 10, 16)
	tags := make(map[string]string, len(m.Tags)+10)
	for k, v := range m.Tags {
		tags[k] = v
	}
	tags["role"] = "nomad"
	tags["region"] = m.Region
	tags["dc"] = m.Datacenter
	tags["id"] = m.ID
	tags["rpc_addr"] = host
	tags["port"] = portStr
	tags["raft_vsn"] = raftProtocol
	tags["leader"] = strconv.FormatBool(m.Leader)
	tags["voter"] = strconv.FormatBool(m.Voter)
	if srv := s.agent.Server(); srv != nil && m.ID == srv.ID() {
		// Only this agent's own build is known for sure.
		tags["build"] = client.Version
		tags["expect"] = strconv.Itoa(srv.Config().BootstrapExpect)
	}
	return &agentMember{
		Name:   m.Name,
		Addr:   host,
		Port:   uint16(port),
		Tags:   tags,
		Status: m.Status,
	}
}

// members asks the cluster for its servers.
func (s *HTTPServer) members(r *http.Request) (*structs.ServerMembersResponse, error) {
	args := structs.GenericRequest{QueryOptions: structs.QueryOptions{Region: s.agent.config.Region, AuthToken: r.Header.Get("X-Nomad-Token")}}
	var reply structs.ServerMembersResponse
	if err := s.rpc(r, "Status.Members", &args, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// agentMembers answers GET /v1/agent/members with the known servers.
func (s *HTTPServer) agentMembers(w http.ResponseWriter, r *http.Request) (any, error) {
	reply, err := s.members(r)
	if err != nil {
		return nil, err
	}
	out := &serverMembers{
		ServerName:   reply.ServerName,
		ServerRegion: reply.ServerRegion,
		ServerDC:     reply.ServerDC,
		Members:      make([]*agentMember, 0, len(reply.Members)),
	}
	for _, m := range reply.Members {
		out.Members = append(out.Members, s.toAgentMember(m))
	}
	m := s.localMeta()
	for _, mem := range reply.Members {
		m.KnownLeader = m.KnownLeader || mem.Leader
	}
	setMeta(w, m)
	return out, nil
}

// agentSelf answers GET /v1/agent/self: this agent's configuration, its
// member entry, and stats grouped as Nomad groups them.
func (s *HTTPServer) agentSelf(w http.ResponseWriter, r *http.Request) (any, error) {
	a := s.agent
	out := &agentSelf{
		Config: s.selfConfig(),
		Stats: map[string]map[string]string{
			"runtime": {
				"arch":       runtime.GOARCH,
				"os":         runtime.GOOS,
				"version":    runtime.Version(),
				"max_procs":  strconv.Itoa(runtime.GOMAXPROCS(0)),
				"goroutines": strconv.Itoa(runtime.NumGoroutine()),
				"cpu_count":  strconv.Itoa(runtime.NumCPU()),
			},
		},
	}
	nomadStats := map[string]string{
		"server": strconv.FormatBool(a.Server() != nil),
		"client": strconv.FormatBool(a.Client() != nil),
	}
	out.Stats["nomad"] = nomadStats

	if srv := a.Server(); srv != nil {
		reply, err := s.members(r)
		if err != nil {
			return nil, err
		}
		for _, m := range reply.Members {
			if m.ID == srv.ID() {
				out.Member = *s.toAgentMember(m)
			}
		}
		if out.Member.Name == "" {
			// Not in its own members list yet; describe it from its config.
			out.Member = *s.toAgentMember(&structs.ServerMember{
				ID: srv.ID(), Name: srv.Config().NodeName, Addr: srv.Addr(),
				Region: srv.Config().Region, Datacenter: srv.Config().Datacenter,
				Status: structs.MemberAlive,
			})
		}
		leaderAddr, leaderID := srv.Leader()
		nomadStats["leader"] = strconv.FormatBool(srv.IsLeader())
		nomadStats["leader_addr"] = leaderAddr
		nomadStats["leader_id"] = leaderID
		nomadStats["bootstrap"] = strconv.FormatBool(srv.Config().BootstrapExpect == 1)
		nomadStats["known_regions"] = "1"
		out.Stats["raft"] = srv.Raft().Stats()
	} else {
		out.Member = agentMember{
			Name:   a.memberName(),
			Status: structs.MemberAlive,
			Tags: map[string]string{
				"role":   "client",
				"region": a.config.Region,
				"dc":     a.config.Datacenter,
				"build":  client.Version,
			},
		}
	}
	if cl := a.Client(); cl != nil {
		out.Stats["client"] = map[string]string{
			"node_id":       cl.NodeID(),
			"known_servers": strings.Join(cl.Servers(), ","),
		}
		out.Member.Tags["node_id"] = cl.NodeID()
	}
	setMeta(w, s.localMeta())
	return out, nil
}

// selfConfig is the agent's configuration in the field names of Nomad's
// agent config. Only settings are listed, never secrets.
func (s *HTTPServer) selfConfig() map[string]any {
	c := s.agent.config
	cfg := map[string]any{
		"Region":     c.Region,
		"Datacenter": c.Datacenter,
		"NodeName":   s.agent.memberName(),
		"DataDir":    c.DataDir,
		"BindAddr":   c.BindAddr,
		"LogLevel":   c.LogLevel,
		"DevMode":    c.DevMode,
		"Version":    map[string]string{"Version": client.Version},
	}
	if c.Ports != nil {
		cfg["Ports"] = map[string]int{"HTTP": c.Ports.HTTP, "RPC": c.Ports.RPC}
	}
	advertise := map[string]string{"HTTP": advertiseFor(s.listener.Addr())}
	if srv := s.agent.Server(); srv != nil {
		advertise["RPC"] = srv.Addr()
	}
	cfg["AdvertiseAddrs"] = advertise
	if sc := c.Server; sc != nil {
		server := map[string]any{
			"Enabled":         sc.Enabled,
			"BootstrapExpect": sc.BootstrapExpect,
			"RaftMultiplier":  sc.RaftMultiplier,
		}
		if sc.ServerJoin != nil {
			server["ServerJoin"] = map[string]any{
				"RetryJoin":     sc.ServerJoin.RetryJoin,
				"RetryInterval": sc.ServerJoin.RetryInterval,
			}
		}
		cfg["Server"] = server
	}
	if cc := c.Client; cc != nil {
		cfg["Client"] = map[string]any{
			"Enabled":   cc.Enabled,
			"Servers":   cc.Servers,
			"NodeClass": cc.NodeClass,
			"Meta":      cc.Meta,
		}
	}
	return cfg
}

// statusLeadershipPath is a Roam route: recent leadership changes with
// their leaderless gaps.
const statusLeadershipPath = "/v1/status/leadership"

// statusLeadership answers GET /v1/status/leadership with the leadership
// changes the leader saw (with ?stale, those the answering server saw),
// oldest first. Not a blocking query.
func (s *HTTPServer) statusLeadership(w http.ResponseWriter, r *http.Request) (any, error) {
	var args structs.GenericRequest
	if err := s.parseQuery(r, &args.QueryOptions); err != nil {
		return nil, err
	}
	args.MinQueryIndex = 0
	var reply structs.LeadershipHistoryResponse
	if err := s.rpc(r, "Status.Leadership", &args, &reply); err != nil {
		return nil, err
	}
	setMeta(w, reply.QueryMeta)
	if reply.Changes == nil {
		reply.Changes = []*structs.LeadershipChange{}
	}
	return &reply, nil
}
