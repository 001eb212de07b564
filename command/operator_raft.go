package command

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("operator", "Cluster administration")
	registerGroup("operator raft", "Inspect and change the Raft configuration")
	register("operator raft list-peers", &Command{Synopsis: "List the Raft peers", Run: runRaftListPeers})
	register("operator raft transfer-leadership", &Command{Synopsis: "Hand Raft leadership to another server", Run: runRaftTransferLeadership})
	register("operator raft remove-peer", &Command{Synopsis: "Remove a server from the Raft configuration", Run: runRaftRemovePeer})
}

const listPeersUsage = `Usage: roam operator raft list-peers [options]

  Lists the servers in the Raft configuration, as the leader has it.
`

func runRaftListPeers(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("operator raft list-peers", listPeersUsage, errOut)
	stale := fs.Bool("stale", false, "let any server answer, not only the leader")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	cfg, err := c.Operator().RaftGetConfiguration(&api.QueryOptions{AllowStale: *stale})
	if err != nil {
		return fail(errOut, "getting peers", err)
	}
	if f.json {
		if err := printJSON(out, cfg); err != nil {
			return fail(errOut, "printing peers", err)
		}
		return 0
	}
	rows := [][]string{{"Node", "ID", "Address", "State", "Voter", "RaftProtocol", "Health", "LastContact"}}
	for _, s := range cfg.Servers {
		state := "follower"
		if s.Leader {
			state = "leader"
		}
		node := s.Node
		if node == "" {
			node = "(unknown)"
		}
		health := "unhealthy"
		if s.Healthy {
			health = "healthy"
		}
		contact := "-"
		switch {
		case s.LastContact < 0:
			contact = "never"
		case s.LastContact > 0:
			contact = s.LastContact.Round(time.Millisecond).String()
		}
		rows = append(rows, []string{node, s.ID, s.Address, state, strconv.FormatBool(s.Voter), s.RaftProtocol, health, contact})
	}
	fmt.Fprint(out, formatColumns(rows))
	return 0
}

const transferLeadershipUsage = `Usage: roam operator raft transfer-leadership [options]

  Hands Raft leadership to the server named by -peer-id or -peer-address,
  or, with neither, to the most up-to-date voter. Returns once another
  server leads.
`

func runRaftTransferLeadership(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("operator raft transfer-leadership", transferLeadershipUsage, errOut)
	id := fs.String("peer-id", "", "Raft ID of the server to hand leadership to")
	addr := fs.String("peer-address", "", "Raft address (host:port) of the server to hand leadership to")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 || (*id != "" && *addr != "") {
		fmt.Fprintln(errOut, "Give at most one of -peer-id and -peer-address, and no arguments")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	var res *api.LeadershipTransfer
	switch {
	case *id != "":
		res, err = c.Operator().RaftTransferLeadershipByID(*id, nil)
	case *addr != "":
		res, err = c.Operator().RaftTransferLeadershipByAddress(*addr, nil)
	default:
		res, err = c.Operator().RaftTransferLeadership(nil)
	}
	if err != nil {
		return fail(errOut, "transferring leadership", err)
	}
	if f.json {
		if err := printJSON(out, res); err != nil {
			return fail(errOut, "printing result", err)
		}
		return 0
	}
	fmt.Fprintf(out, "Transferred leadership to peer %s (%s)\n", res.NewLeaderID, res.NewLeaderAddr)
	return 0
}

const removePeerUsage = `Usage: roam operator raft remove-peer [options]

  Removes the server named by -peer-id or -peer-address from the Raft
  configuration. Use it for servers that are gone for good.
`

func runRaftRemovePeer(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("operator raft remove-peer", removePeerUsage, errOut)
	id := fs.String("peer-id", "", "Raft ID of the server to remove")
	addr := fs.String("peer-address", "", "Raft address (host:port) of the server to remove")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 || (*id == "") == (*addr == "") {
		fmt.Fprintln(errOut, "Give exactly one of -peer-id and -peer-address, and no arguments")
		fs.Usage()
		return 1
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if *id != "" {
		err = c.Operator().RaftRemovePeerByID(*id, nil)
	} else {
		err = c.Operator().RaftRemovePeerByAddress(*addr, nil)
	}
	if err != nil {
		return fail(errOut, "removing peer", err)
	}
	fmt.Fprintf(out, "Removed peer %s%s\n", *id, *addr)
	return 0
}
