package api

import (
	"net/http"
	"net/url"
	"time"
)

// Operator runs cluster administration.
type Operator struct{ c *Client }

// Operator returns a handle on the operator endpoints.
func (c *Client) Operator() *Operator { return &Operator{c} }

// RaftServer is one server in the Raft configuration.
type RaftServer struct {
	ID           string
	Node         string
	Address      string
	Leader       bool
	Voter        bool
	RaftProtocol string
	// Healthy and LastContact are the answering server's view of the
	// peer (LastContact is 0 for itself, -1 if never heard from).
	Healthy     bool
	LastContact time.Duration
}

// RaftConfiguration is the Raft configuration and the index it was read at.
type RaftConfiguration struct {
	Servers []*RaftServer
	Index   uint64
}

// LeadershipTransfer names the leader after a transfer.
type LeadershipTransfer struct {
	NewLeaderID   string
	NewLeaderAddr string
}

// RaftGetConfiguration returns the Raft configuration.
func (op *Operator) RaftGetConfiguration(q *QueryOptions) (*RaftConfiguration, error) {
	var out RaftConfiguration
	if _, err := op.c.query("/v1/operator/raft/configuration", &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// RaftRemovePeerByID removes the server with Raft ID id.
func (op *Operator) RaftRemovePeerByID(id string, w *WriteOptions) error {
	_, err := op.c.write(http.MethodDelete, "/v1/operator/raft/peer", url.Values{"id": {id}}, nil, nil, w)
	return err
}

// RaftRemovePeerByAddress removes the server with Raft address address.
func (op *Operator) RaftRemovePeerByAddress(address string, w *WriteOptions) error {
	_, err := op.c.write(http.MethodDelete, "/v1/operator/raft/peer", url.Values{"address": {address}}, nil, nil, w)
	return err
}

// RaftTransferLeadership asks the leader to hand over to the most
// up-to-date voter, and returns once another server leads.
func (op *Operator) RaftTransferLeadership(w *WriteOptions) (*LeadershipTransfer, error) {
	return op.transfer(url.Values{}, w)
}

// RaftTransferLeadershipByID hands leadership to the voter with Raft ID id.
func (op *Operator) RaftTransferLeadershipByID(id string, w *WriteOptions) (*LeadershipTransfer, error) {
	return op.transfer(url.Values{"id": {id}}, w)
}

// RaftTransferLeadershipByAddress hands leadership to the voter with Raft
// address address.
func (op *Operator) RaftTransferLeadershipByAddress(address string, w *WriteOptions) (*LeadershipTransfer, error) {
	return op.transfer(url.Values{"address": {address}}, w)
}

func (op *Operator) transfer(params url.Values, w *WriteOptions) (*LeadershipTransfer, error) {
	var out LeadershipTransfer
	if _, err := op.c.write(http.MethodPut, "/v1/operator/raft/transfer-leadership", params, nil, &out, w); err != nil {
		return nil, err
	}
	return &out, nil
}
