package nomad

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/roamhq/roam/internal/profile"
	"github.com/roamhq/roam/structs"
)

// Agent serves what an operator asks of one server's process: its runtime
// profiles and metrics (docs/operations.md, "Profiling").
type Agent struct {
	srv *Server
}

// Profile takes a profile on the server args.ServerID names, passing the
// call on to it when that is another server. The ACL table asks for
// agent:write; with ACLs off, the server taking the profile must run with
// enable_debug, as Nomad's agents must.
func (a *Agent) Profile(args *structs.AgentProfileRequest, reply *structs.AgentProfileResponse) error {
	srv := a.srv
	if r := args.Region; r != "" && r != srv.config.Region {
		return fmt.Errorf("%w: %q (this cluster is %q)", structs.ErrWrongRegion, r, srv.config.Region)
	}
	if args.Kind != structs.AgentProfileMetrics {
		if err := (profile.Request{Kind: args.Kind, Seconds: args.Seconds, Debug: args.Debug, GC: args.GC}).Validate(); err != nil {
			return fmt.Errorf("%w: %w", structs.ErrInvalidRequest, err)
		}
	} else if args.Seconds != 0 || args.Debug != 0 || args.GC {
		return fmt.Errorf("%w: metrics take no seconds, debug or gc", structs.ErrInvalidRequest)
	}
	target := args.ServerID
	if target == "leader" {
		_, id := srv.Leader()
		if id == "" {
			return fmt.Errorf("%w: asked for the leader's profile", structs.ErrNoLeader)
		}
		target = id
	}
	if target != "" && target != srv.ID() {
		if args.Forwarded {
			// The member list that sent it here is out of date (a server
			// replaced at the same address): no second hop.
			return fmt.Errorf("%w: server %q was asked for server %q's profile", structs.ErrNotFound, srv.ID(), target)
		}
		return a.forwardProfile(target, args, reply)
	}
	if !srv.config.ACLEnabled && !srv.config.EnableDebug {
		return fmt.Errorf("%w: server %s runs without enable_debug, and ACLs are off: its profiles are not served",
			structs.ErrPermissionDenied, srv.config.NodeName)
	}
	var buf bytes.Buffer
	if args.Kind == structs.AgentProfileMetrics {
		if srv.config.Metrics == nil {
			return fmt.Errorf("%w: server %s keeps no metrics", structs.ErrNotFound, srv.config.NodeName)
		}
		summary, err := srv.config.Metrics()
		if err != nil {
			return fmt.Errorf("server %s: read metrics: %w", srv.config.NodeName, err)
		}
		if err := json.NewEncoder(&buf).Encode(summary); err != nil {
			return fmt.Errorf("server %s: encode metrics: %w", srv.config.NodeName, err)
		}
	} else {
		req := profile.Request{Kind: args.Kind, Seconds: args.Seconds, Debug: args.Debug, GC: args.GC}
		// The caller's context, so a caller that leaves frees the
		// profiler at once, and the server's.
		ctx, cancel := context.WithTimeout(callerContext(args), args.CallTimeout())
		defer cancel()
		defer context.AfterFunc(srv.shutdownCtx, cancel)()
		if err := profile.Take(ctx, req, &buf); err != nil {
			return fmt.Errorf("server %s: %s: %w", srv.config.NodeName, args.Kind, err)
		}
	}
	reply.ServerID, reply.ServerName, reply.Payload = srv.ID(), srv.config.NodeName, buf.Bytes()
	return nil
}

// forwardProfile passes a profile call on to the server with ID id, which
// checks the caller's token and its own enable_debug.
func (a *Agent) forwardProfile(id string, args *structs.AgentProfileRequest, reply *structs.AgentProfileResponse) error {
	srv := a.srv
	var addr string
	for _, m := range srv.members.list() {
		if m.ID == id {
			addr = m.Addr
			break
		}
	}
	if addr == "" {
		return fmt.Errorf("%w: no server with ID %q is known (see `roam server members`)", structs.ErrNotFound, id)
	}
	fwd := *args
	fwd.ServerID, fwd.Forwarded = id, true
	ctx, cancel := context.WithTimeout(callerContext(args), args.CallTimeout())
	defer cancel()
	defer context.AfterFunc(srv.shutdownCtx, cancel)()
	return srv.connPool.RPC(ctx, addr, "Agent.Profile", &fwd, reply)
}
