package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// fakeAgent records requests and answers each path with a canned reply.
type fakeAgent struct {
	mu       sync.Mutex
	requests []*http.Request
	replies  map[string]fakeReply // by "METHOD path"
}

type fakeReply struct {
	code   int
	body   string
	header map[string]string
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r)
	reply, ok := f.replies[r.Method+" "+r.URL.Path]
	f.mu.Unlock()
	if !ok {
		http.Error(w, "Invalid URL path", http.StatusNotFound)
		return
	}
	for k, v := range reply.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(reply.code)
	fmt.Fprint(w, reply.body)
}

func (f *fakeAgent) last(t *testing.T) *http.Request {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	must.SliceNotEmpty(t, f.requests)
	return f.requests[len(f.requests)-1]
}

func newFake(t *testing.T, replies map[string]fakeReply) (*fakeAgent, *Client) {
	t.Helper()
	f := &fakeAgent{replies: replies}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := NewClient(&Config{Address: srv.URL})
	must.NoError(t, err)
	return f, c
}

var readHeaders = map[string]string{
	"X-Nomad-Index":       "42",
	"X-Nomad-KnownLeader": "true",
	"X-Nomad-LastContact": "1500",
}

func TestNewClient_Address(t *testing.T) {
	t.Setenv(AddressEnv, "")
	c, err := NewClient(nil)
	must.NoError(t, err)
	must.EqOp(t, DefaultAddress, c.Address())

	t.Setenv(AddressEnv, "http://10.0.0.1:4646")
	c, err = NewClient(nil)
	must.NoError(t, err)
	must.EqOp(t, "http://10.0.0.1:4646", c.Address())

	c, err = NewClient(&Config{Address: "127.0.0.1:9999"})
	must.NoError(t, err)
	must.EqOp(t, "http://127.0.0.1:9999", c.Address())

	_, err = NewClient(&Config{Address: "ftp://127.0.0.1:9999"})
	must.ErrorContains(t, err, "scheme")
}

func TestQuery_OptionsAndMeta(t *testing.T) {
	f, c := newFake(t, map[string]fakeReply{
		"GET /v1/nodes": {code: 200, body: `[{"ID":"abc","Status":"ready","Drain":false}]`, header: readHeaders},
	})
	nodes, meta, err := c.Nodes().List(&QueryOptions{
		Region: "eu", AllowStale: true, WaitIndex: 7, WaitTime: 5 * time.Second,
		Prefix: "ab", AuthToken: "tok",
	})
	must.NoError(t, err)
	must.SliceLen(t, 1, nodes)
	must.EqOp(t, "abc", nodes[0].ID)
	must.EqOp(t, uint64(42), meta.LastIndex)
	must.True(t, meta.KnownLeader)
	must.EqOp(t, 1500*time.Millisecond, meta.LastContact)

	req := f.last(t)
	q := req.URL.Query()
	must.EqOp(t, "eu", q.Get("region"))
	must.EqOp(t, "7", q.Get("index"))
	must.EqOp(t, "5000ms", q.Get("wait"))
	must.EqOp(t, "ab", q.Get("prefix"))
	must.MapContainsKey(t, map[string][]string(q), "stale")
	must.EqOp(t, "tok", req.Header.Get("X-Nomad-Token"))
}

func TestQuery_DefaultWaitTime(t *testing.T) {
	f := &fakeAgent{replies: map[string]fakeReply{
		"GET /v1/nodes": {code: 200, body: `[]`, header: readHeaders},
	}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := NewClient(&Config{Address: srv.URL, WaitTime: 2 * time.Minute, Region: "r1"})
	must.NoError(t, err)

	_, _, err = c.Nodes().List(&QueryOptions{WaitIndex: 3})
	must.NoError(t, err)
	q := f.last(t).URL.Query()
	must.EqOp(t, "120000ms", q.Get("wait"))
	must.EqOp(t, "r1", q.Get("region"))

	// Without a wait index there is nothing to wait for.
	_, _, err = c.Nodes().List(nil)
	must.NoError(t, err)
	must.EqOp(t, "", f.last(t).URL.Query().Get("wait"))
}

func TestUnexpectedResponseError(t *testing.T) {
	_, c := newFake(t, map[string]fakeReply{
		"GET /v1/node/nope": {code: 404, body: "node not found\n"},
	})
	_, _, err := c.Nodes().Info("nope", nil)
	var ure *UnexpectedResponseError
	must.True(t, errors.As(err, &ure))
	must.EqOp(t, http.StatusNotFound, ure.StatusCode())
	must.EqOp(t, "node not found", ure.Body())
	must.EqOp(t, "Unexpected response code: 404 (node not found)", err.Error())
}

func TestNodes_InfoEscapesID(t *testing.T) {
	f, c := newFake(t, map[string]fakeReply{
		"GET /v1/node/a b": {code: 200, body: `{"ID":"a b","Attributes":{"os.name":"linux"}}`, header: readHeaders},
	})
	node, meta, err := c.Nodes().Info("a b", nil)
	must.NoError(t, err)
	must.EqOp(t, "a b", node.ID)
	must.EqOp(t, "linux", node.Attributes["os.name"])
	must.EqOp(t, uint64(42), meta.LastIndex)
	must.EqOp(t, "/v1/node/a%20b", f.last(t).URL.EscapedPath())
}

func TestStatusAndAgent(t *testing.T) {
	_, c := newFake(t, map[string]fakeReply{
		"GET /v1/status/leader": {code: 200, body: `"10.0.0.1:4647"`, header: readHeaders},
		"GET /v1/status/peers":  {code: 200, body: `["10.0.0.1:4647","10.0.0.2:4647"]`, header: readHeaders},
		"GET /v1/agent/members": {code: 200, body: `{"ServerName":"s1","ServerRegion":"global","ServerDC":"dc1",
			"Members":[{"Name":"s1","Addr":"10.0.0.1","Port":4647,"Status":"alive","Tags":{"leader":"true"}}]}`},
		"GET /v1/agent/self": {code: 200, body: `{"config":{"Region":"global"},"member":{"Name":"s1"},
			"stats":{"nomad":{"leader":"true"}}}`},
	})
	leader, err := c.Status().Leader()
	must.NoError(t, err)
	must.EqOp(t, "10.0.0.1:4647", leader)
	peers, err := c.Status().Peers()
	must.NoError(t, err)
	must.Eq(t, []string{"10.0.0.1:4647", "10.0.0.2:4647"}, peers)
	members, err := c.Agent().Members()
	must.NoError(t, err)
	must.SliceLen(t, 1, members.Members)
	must.EqOp(t, uint16(4647), members.Members[0].Port)
	must.EqOp(t, "true", members.Members[0].Tags["leader"])
	self, err := c.Agent().Self()
	must.NoError(t, err)
	must.EqOp(t, "s1", self.Member.Name)
	must.Eq[any](t, "global", self.Config["Region"])
	must.EqOp(t, "true", self.Stats["nomad"]["leader"])
}

func TestOperator(t *testing.T) {
	f, c := newFake(t, map[string]fakeReply{
		"GET /v1/operator/raft/configuration": {code: 200, header: readHeaders,
			body: `{"Index":9,"Servers":[{"ID":"id1","Node":"s1","Address":"10.0.0.1:4647","Leader":true,"Voter":true,"RaftProtocol":"3"}]}`},
		"PUT /v1/operator/raft/transfer-leadership": {code: 200, body: `{"NewLeaderID":"id2","NewLeaderAddr":"10.0.0.2:4647"}`},
		"DELETE /v1/operator/raft/peer":             {code: 200},
	})
	cfg, err := c.Operator().RaftGetConfiguration(&QueryOptions{AllowStale: true})
	must.NoError(t, err)
	must.EqOp(t, uint64(9), cfg.Index)
	must.Eq(t, &RaftServer{ID: "id1", Node: "s1", Address: "10.0.0.1:4647", Leader: true, Voter: true, RaftProtocol: "3"}, cfg.Servers[0])

	res, err := c.Operator().RaftTransferLeadershipByID("id2", nil)
	must.NoError(t, err)
	must.Eq(t, &LeadershipTransfer{NewLeaderID: "id2", NewLeaderAddr: "10.0.0.2:4647"}, res)
	must.Eq(t, url.Values{"id": {"id2"}}, f.last(t).URL.Query())

	_, err = c.Operator().RaftTransferLeadershipByAddress("10.0.0.2:4647", &WriteOptions{Region: "global"})
	must.NoError(t, err)
	must.Eq(t, url.Values{"address": {"10.0.0.2:4647"}, "region": {"global"}}, f.last(t).URL.Query())

	_, err = c.Operator().RaftTransferLeadership(nil)
	must.NoError(t, err)
	must.MapEmpty(t, map[string][]string(f.last(t).URL.Query()))

	must.NoError(t, c.Operator().RaftRemovePeerByID("id3", nil))
	must.Eq(t, url.Values{"id": {"id3"}}, f.last(t).URL.Query())
	must.NoError(t, c.Operator().RaftRemovePeerByAddress("10.0.0.3:4647", nil))
	must.Eq(t, url.Values{"address": {"10.0.0.3:4647"}}, f.last(t).URL.Query())
}

func TestMetrics(t *testing.T) {
	f := &fakeAgent{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r)
		f.mu.Unlock()
		if r.URL.Query().Get("format") == "prometheus" {
			fmt.Fprint(w, "# TYPE roam_up gauge\nroam_up 1\n")
			return
		}
		fmt.Fprint(w, `{"Timestamp":"2026-01-01 00:00:00 +0000 UTC","Gauges":[{"Name":"roam.up","Value":1,"Labels":{}}],
			"Samples":[{"Name":"roam.rpc","Count":2,"Sum":3,"Min":1,"Max":2,"Mean":1.5,"Stddev":0.7,"Labels":{"m":"x"}}]}`)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(&Config{Address: srv.URL})
	must.NoError(t, err)

	sum, err := c.Metrics().Summary(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, sum.Gauges)
	must.EqOp(t, float32(1), sum.Gauges[0].Value)
	must.EqOp(t, 2, sum.Samples[0].Count)
	must.EqOp(t, "x", sum.Samples[0].Labels["m"])

	text, err := c.Metrics().Prometheus(nil)
	must.NoError(t, err)
	must.StrContains(t, string(text), "roam_up 1")
}

func TestQuery_Context(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		close(block)
		srv.Close()
	})
	c, err := NewClient(&Config{Address: srv.URL})
	must.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = c.Nodes().List((&QueryOptions{WaitIndex: 1}).WithContext(ctx))
	must.ErrorIs(t, err, context.Canceled)
}
