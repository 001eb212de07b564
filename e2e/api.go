//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The HTTP API is read with plain encoding/json into the structs below,
// which carry the Nomad v1 field names Roam promises to serve.

// httpClient is shared by every request the harness makes. It sends
// harnessToken (set by a test that turns ACLs on) as X-Nomad-Token on
// every request that does not carry that header already; a request that
// sets the header to "" goes as the anonymous token.
var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: tokenTransport{http.DefaultTransport}}

// harnessToken is the ACL secret the harness's own requests carry.
var harnessToken atomic.Value // string

type tokenTransport struct{ next http.RoundTripper }

func (tt tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	tok, _ := harnessToken.Load().(string)
	if _, set := r.Header["X-Nomad-Token"]; tok == "" || set {
		return tt.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("X-Nomad-Token", tok)
	return tt.next.RoundTrip(r)
}

// AgentMember is one entry of /v1/agent/members.
type AgentMember struct {
	Name   string
	Addr   string
	Port   int
	Status string
	Tags   map[string]string
}

// AgentMembers is the body of /v1/agent/members.
type AgentMembers struct {
	ServerName string
	Members    []AgentMember
}

// NodeStub is one entry of /v1/nodes.
type NodeStub struct {
	ID                    string
	Name                  string
	Datacenter            string
	NodeClass             string
	Status                string
	SchedulingEligibility string
	Drain                 bool
	CreateIndex           uint64
	ModifyIndex           uint64
}

// RaftServer is one entry of /v1/operator/raft/configuration.
type RaftServer struct {
	ID      string
	Node    string
	Address string
	Leader  bool
	Voter   bool
}

// RaftConfiguration is the body of /v1/operator/raft/configuration.
type RaftConfiguration struct {
	Servers []RaftServer
	Index   uint64
}

// QueryMeta is what a read's headers say about the answer.
type QueryMeta struct {
	// Index is X-Nomad-Index: the Raft index the answer reflects.
	Index       uint64
	KnownLeader bool
}

// GetJSON GETs base+path and decodes a 2xx JSON body into out.
func GetJSON(base, path string, out any) error {
	_, err := GetJSONMeta(base, path, out)
	return err
}

// GetJSONMeta is GetJSON that also returns the query metadata headers; a
// missing or malformed index header is an error.
func GetJSONMeta(base, path string, out any) (*QueryMeta, error) {
	resp, err := httpClient.Get(base + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s%s: read body: %w", base, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("GET %s%s: %s: %s", base, path, resp.Status, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return nil, fmt.Errorf("GET %s%s: decode %q: %w", base, path, body, err)
	}
	meta := &QueryMeta{KnownLeader: resp.Header.Get("X-Nomad-KnownLeader") == "true"}
	if h := resp.Header.Get("X-Nomad-Index"); h != "" {
		meta.Index, err = strconv.ParseUint(h, 10, 64)
		if err != nil {
			return meta, fmt.Errorf("GET %s%s: X-Nomad-Index %q: %w", base, path, h, err)
		}
	}
	return meta, nil
}

// StatusLeader returns the leader's RPC address as the agent at base sees
// it, "" when it knows none.
func StatusLeader(base string) (string, error) {
	var leader string
	err := GetJSON(base, "/v1/status/leader", &leader)
	return leader, err
}

// StatusPeers returns the RPC addresses of the Raft peers.
func StatusPeers(base string) ([]string, error) {
	var peers []string
	err := GetJSON(base, "/v1/status/peers", &peers)
	return peers, err
}

// Members returns /v1/agent/members from the agent at base.
func Members(base string) (*AgentMembers, error) {
	var m AgentMembers
	err := GetJSON(base, "/v1/agent/members", &m)
	return &m, err
}

// Nodes returns /v1/nodes. With stale set the agent answers from its own
// state instead of asking the leader.
func Nodes(base string, stale bool) ([]NodeStub, error) {
	nodes, _, err := NodesMeta(base, stale)
	return nodes, err
}

// NodesMeta is Nodes with the query metadata.
func NodesMeta(base string, stale bool) ([]NodeStub, *QueryMeta, error) {
	path := "/v1/nodes"
	if stale {
		path += "?stale=true"
	}
	var nodes []NodeStub
	meta, err := GetJSONMeta(base, path, &nodes)
	return nodes, meta, err
}

// RaftConfig returns /v1/operator/raft/configuration.
func RaftConfig(base string) (*RaftConfiguration, error) {
	var c RaftConfiguration
	err := GetJSON(base, "/v1/operator/raft/configuration", &c)
	return &c, err
}
