package api

// Status reads cluster status.
type Status struct{ c *Client }

// Status returns a handle on the status endpoints.
func (c *Client) Status() *Status { return &Status{c} }

// Leader returns the leader's RPC address, "" when there is none.
func (s *Status) Leader() (string, error) {
	var leader string
	if _, err := s.c.query("/v1/status/leader", &leader, nil); err != nil {
		return "", err
	}
	return leader, nil
}

// Peers returns the RPC addresses of the Raft voters.
func (s *Status) Peers() ([]string, error) {
	var peers []string
	if _, err := s.c.query("/v1/status/peers", &peers, nil); err != nil {
		return nil, err
	}
	return peers, nil
}
