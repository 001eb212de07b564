package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/roamhq/roam/acl"
	"github.com/roamhq/roam/nomad"
	"github.com/roamhq/roam/structs"
)

// httpRule is what one route and method needs. exempt, when set, says why
// the route is not checked against a token: "open" (it reveals nothing
// worth a token: the leader's address, metrics), "self" (it answers only
// about the caller's own token, which the server resolves), "bootstrap"
// (once only, or with the leader's reset file).
type httpRule struct {
	exempt string
	allow  func(a *acl.ACL) bool
}

func httpNS(capability string) httpRule {
	return httpRule{allow: func(a *acl.ACL) bool {
		return a.AllowNamespaceOperation(structs.DefaultNamespace, capability)
	}}
}

func httpCoarse(fn func(*acl.ACL) bool) httpRule { return httpRule{allow: fn} }

var httpManagement = httpCoarse((*acl.ACL).IsManagement)

// httpRouteKey names a route and method in httpACLRules.
func httpRouteKey(method, route string) string { return method + " " + route }

// httpACLRules maps every route and method to what it needs. The RPC
// behind a route is checked again on the server (nomad/acl.go), which
// also checks what a route cannot see, such as the CSI volumes a job
// mounts. TestHTTPACL_RouteTable fails when a route has no row.
var httpACLRules = func() map[string]httpRule {
	rules := map[string]httpRule{}
	add := func(route string, rule httpRule, methods ...string) {
		for _, m := range methods {
			rules[httpRouteKey(m, route)] = rule
		}
	}
	get, del := http.MethodGet, http.MethodDelete
	put, post := http.MethodPut, http.MethodPost
	open := httpRule{exempt: "open"}

	add("/v1/status/leader", open, get)
	add("/v1/status/peers", open, get)
	add("/v1/metrics", open, get)
	add("/v1/agent/self", httpCoarse((*acl.ACL).AllowAgentRead), get)
	add("/v1/agent/members", httpCoarse((*acl.ACL).AllowNodeRead), get)
	add(debugPathPrefix, httpCoarse((*acl.ACL).AllowAgentWrite), get, post)
	add(agentPprofPrefix, httpCoarse((*acl.ACL).AllowAgentWrite), get)

	add("/v1/nodes", httpCoarse((*acl.ACL).AllowNodeRead), get)
	add(nodePathPrefix, httpCoarse((*acl.ACL).AllowNodeRead), get)
	add(subRoute(nodePathPrefix, "allocations"), httpCoarse((*acl.ACL).AllowNodeRead), get)
	add(subRoute(nodePathPrefix, "drain"), httpCoarse((*acl.ACL).AllowNodeWrite), put, post)
	add(subRoute(nodePathPrefix, "eligibility"), httpCoarse((*acl.ACL).AllowNodeWrite), put, post)

	add("/v1/operator/raft/configuration", httpCoarse((*acl.ACL).AllowOperatorRead), get)
	add("/v1/operator/raft/peer", httpCoarse((*acl.ACL).AllowOperatorWrite), del)
	add("/v1/operator/raft/transfer-leadership", httpCoarse((*acl.ACL).AllowOperatorWrite), put, post)
	add("/v1/operator/snapshot", httpManagement, get, put)

	add("/v1/jobs", httpNS(acl.NamespaceCapabilityListJobs), get)
	add("/v1/jobs", httpNS(acl.NamespaceCapabilitySubmitJob), put, post)
	add("/v1/jobs/parse", httpNS(acl.NamespaceCapabilitySubmitJob), put, post)
	add(jobPathPrefix, httpNS(acl.NamespaceCapabilityReadJob), get)
	add(jobPathPrefix, httpNS(acl.NamespaceCapabilitySubmitJob), put, post, del)
	add(subRoute(jobPathPrefix, "allocations"), httpNS(acl.NamespaceCapabilityReadJob), get)
	add(subRoute(jobPathPrefix, "evaluations"), httpNS(acl.NamespaceCapabilityReadJob), get)
	add("/v1/allocations", httpNS(acl.NamespaceCapabilityReadJob), get)
	add(allocPathPrefix, httpNS(acl.NamespaceCapabilityReadJob), get)
	add("/v1/evaluations", httpNS(acl.NamespaceCapabilityReadJob), get)
	add(evalPathPrefix, httpNS(acl.NamespaceCapabilityReadJob), get)
	add(logsPathPrefix, httpNS(acl.NamespaceCapabilityReadLogs), get)
	add(subRoute(clientAllocPathPrefix, "stats"), httpNS(acl.NamespaceCapabilityReadJob), get)
	for _, p := range []string{fsLsPathPrefix, fsStatPathPrefix, fsCatPathPrefix} {
		add(p, httpNS(acl.NamespaceCapabilityReadFS), get)
	}

	add("/v1/volumes", httpNS(acl.NamespaceCapabilityCSIListVolume), get)
	add(csiVolumePathPrefix, httpNS(acl.NamespaceCapabilityCSIReadVolume), get)
	add(csiVolumePathPrefix, httpNS(acl.NamespaceCapabilityCSIWriteVolume), put, post, del)
	add(subRoute(csiVolumePathPrefix, "create"), httpNS(acl.NamespaceCapabilityCSIWriteVolume), put, post)
	add(subRoute(csiVolumePathPrefix, "delete"), httpNS(acl.NamespaceCapabilityCSIWriteVolume), del)
	add(subRoute(csiVolumePathPrefix, "detach"), httpNS(acl.NamespaceCapabilityCSIWriteVolume), put, del)
	add(csiSnapshotPath, httpNS(acl.NamespaceCapabilityCSIWriteVolume), put, post, del)
	add(csiSnapshotPath, httpNS(acl.NamespaceCapabilityCSIListVolume), get)
	add("/v1/volumes/external", httpNS(acl.NamespaceCapabilityCSIListVolume), get)
	add(subRoute(csiVolumePathPrefix, "expand"), httpNS(acl.NamespaceCapabilityCSIWriteVolume), put, post)
	add(csiLanesPath, httpCoarse((*acl.ACL).AllowPluginRead), get)
	add(statusLeadershipPath, httpCoarse((*acl.ACL).AllowOperatorRead), get)
	add("/v1/plugins", httpCoarse((*acl.ACL).AllowPluginList), get)
	add(csiPluginPathPrefix, httpCoarse((*acl.ACL).AllowPluginRead), get)

	// The event stream carries every topic (jobs, allocations, evaluations,
	// nodes, volumes, plugins), so it needs read on all of them.
	add(eventStreamPath, httpRule{allow: func(a *acl.ACL) bool {
		return a.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilityReadJob) &&
			a.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilityCSIReadVolume) &&
			a.AllowNodeRead() && a.AllowPluginRead()
	}}, get)

	add("/v1/acl/bootstrap", httpRule{exempt: "bootstrap"}, put, post)
	add("/v1/acl/policies", httpManagement, get)
	// GET /v1/acl/policy/self answers about the caller's own token; the
	// handler lets it through (see authorizeHTTP).
	add(aclPolicyPathPrefix, httpManagement, get, put, post, del)
	add("/v1/acl/tokens", httpManagement, get)
	add("/v1/acl/token", httpManagement, put, post)
	add(aclTokenPathPrefix, httpManagement, get, put, post, del)
	return rules
}()

// authorizeHTTP is the one place every HTTP request is checked, after its
// route and method are known and before its handler runs.
func (s *HTTPServer) authorizeHTTP(r *http.Request, route string) error {
	if !s.agent.config.aclEnabled() {
		return nil
	}
	rule, ok := httpACLRules[httpRouteKey(r.Method, route)]
	if !ok {
		return fmt.Errorf("%w: %s %s has no acl rule", structs.ErrPermissionDenied, r.Method, route)
	}
	if rule.exempt != "" {
		return nil
	}
	if r.Method == http.MethodGet && (route == aclTokenPathPrefix || route == aclPolicyPathPrefix) && pathID(r, route) == "self" {
		return nil
	}
	a, accessor, err := s.agent.resolveACL(r.Context(), r.Header.Get("X-Nomad-Token"))
	if err != nil {
		if errors.Is(err, structs.ErrPermissionDenied) {
			s.logger.Debug("request denied", "method", r.Method, "route", route, "reason", "token not found")
		}
		return err
	}
	if !rule.allow(a) {
		s.logger.Debug("request denied", "method", r.Method, "route", route, "accessor", accessor)
		return structs.ErrPermissionDenied
	}
	return nil
}

// clientACLCache holds tokens a client-only agent resolved through the
// servers, for token_ttl: a client has no copy of the ACL tables to
// notice a change by, so it relies on the TTL (the servers check every
// RPC themselves, at once).
type clientACLCache struct {
	mu      sync.Mutex
	entries map[string]clientACLEntry
}

type clientACLEntry struct {
	acl      *acl.ACL
	accessor string
	expires  time.Time
}

// resolveACL returns the rules for secret, and the accessor to log.
func (a *Agent) resolveACL(ctx context.Context, secret string) (*acl.ACL, string, error) {
	if srv := a.server; srv != nil {
		id, err := srv.ResolveToken(secret)
		if err != nil {
			return nil, "", err
		}
		return id.ACL, id.Accessor(), nil
	}
	ttl := nomad.DefaultACLTokenTTL
	if a.config.ACL != nil {
		ttl = parseDurationOr(a.config.ACL.TokenTTL, ttl)
	}
	c := &a.aclCache
	now := time.Now()
	c.mu.Lock()
	if e, ok := c.entries[secret]; ok && now.Before(e.expires) {
		c.mu.Unlock()
		return e.acl, e.accessor, nil
	}
	c.mu.Unlock()

	args := structs.GenericRequest{QueryOptions: structs.QueryOptions{AuthToken: secret, Region: a.config.Region}}
	var reply structs.ResolveACLTokenResponse
	if err := a.callerRPC(ctx, "ACL.ResolveToken", &args, &reply); err != nil {
		return nil, "", err
	}
	var (
		rules    *acl.ACL
		accessor = "anonymous"
	)
	if reply.Token != nil {
		accessor = reply.Token.AccessorID
	}
	if reply.Token != nil && reply.Token.Type == structs.ACLManagementToken {
		rules = acl.ManagementACL
	} else {
		var parsed []*acl.Policy
		for _, p := range reply.Policies {
			if pp, err := acl.Parse(p.Rules); err == nil {
				parsed = append(parsed, pp)
			}
		}
		rules = acl.DenyAll
		if len(parsed) > 0 {
			rules = acl.New(parsed)
		}
	}
	c.mu.Lock()
	if c.entries == nil || len(c.entries) >= 4096 {
		c.entries = make(map[string]clientACLEntry)
	}
	c.entries[secret] = clientACLEntry{acl: rules, accessor: accessor, expires: now.Add(ttl)}
	c.mu.Unlock()
	return rules, accessor, nil
}
