package nomad

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/roamhq/roam/acl"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// ErrTokenNotFound is a token secret no token and no node has. It wraps
// ErrPermissionDenied, so callers answer 403.
var ErrTokenNotFound = fmt.Errorf("%w: acl token not found", structs.ErrPermissionDenied)

// Identity is who a request's secret says the caller is: an ACL token (or
// the anonymous token, Token nil), or a client node by its secret.
type Identity struct {
	ACL   *acl.ACL
	Token *structs.ACLToken
	// Node is set when the secret is a node's SecretID; such a caller has
	// no ACL capabilities and may call only the node-secret RPCs.
	Node *structs.Node
}

// Accessor names the caller for logs: never the secret.
func (id *Identity) Accessor() string {
	switch {
	case id == nil:
		return ""
	case id.Node != nil:
		return "node:" + id.Node.ID
	case id.Token == nil:
		return "anonymous"
	}
	return id.Token.AccessorID
}

// maxCachedTokens bounds the resolution cache; past it the cache starts
// over, so guessed secrets cannot grow it.
const maxCachedTokens = 4096

// DefaultACLTokenTTL is how long a resolved token is cached at most.
const DefaultACLTokenTTL = 30 * time.Second

// aclCache holds resolved identities by secret. It is emptied when the
// ACL tables' index moves (a token or policy was written or deleted) or
// the store is swapped by a restore, so a change is seen by the next
// request on every server; an entry also expires after its TTL.
type aclCache struct {
	mu      sync.Mutex
	store   *state.StateStore
	index   uint64
	entries map[string]aclCacheEntry
}

type aclCacheEntry struct {
	id      *Identity
	expires time.Time
}

func aclTablesIndex(st *state.StateStore) (uint64, error) {
	p, err := st.Index(state.TableACLPolicies)
	if err != nil {
		return 0, err
	}
	t, err := st.Index(state.TableACLTokens)
	if err != nil {
		return 0, err
	}
	return max(p, t), nil
}

// ResolveToken returns the identity secret stands for. With ACLs off it
// is management for every caller.
func (s *Server) ResolveToken(secret string) (*Identity, error) {
	if !s.config.ACLEnabled {
		return &Identity{ACL: acl.ManagementACL}, nil
	}
	st := s.State()
	index, err := aclTablesIndex(st)
	if err != nil {
		return nil, err
	}
	ttl := s.config.ACLTokenTTL
	if ttl <= 0 {
		ttl = DefaultACLTokenTTL
	}
	now := time.Now()
	c := &s.aclCache
	c.mu.Lock()
	if c.store != st || c.index != index || c.entries == nil || len(c.entries) >= maxCachedTokens {
		c.store, c.index, c.entries = st, index, make(map[string]aclCacheEntry)
	}
	if e, ok := c.entries[secret]; ok && now.Before(e.expires) {
		c.mu.Unlock()
		return e.id, nil
	}
	c.mu.Unlock()

	id, err := resolveFromState(st, secret)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.store == st && c.index == index {
		c.entries[secret] = aclCacheEntry{id: id, expires: now.Add(ttl)}
	}
	c.mu.Unlock()
	return id, nil
}

// resolveFromState looks secret up: an empty secret is the anonymous
// token, with the anonymous policy if one exists.
func resolveFromState(st *state.StateStore, secret string) (*Identity, error) {
	if secret == "" {
		a, err := aclForPolicies(st, []string{structs.AnonymousPolicyName})
		if err != nil {
			return nil, err
		}
		return &Identity{ACL: a}, nil
	}
	token, err := st.ACLTokenBySecretID(nil, secret)
	if err != nil {
		return nil, err
	}
	if token == nil {
		node, err := st.NodeBySecretID(nil, secret)
		if err != nil {
			return nil, err
		}
		if node != nil {
			return &Identity{ACL: acl.DenyAll, Node: node}, nil
		}
		return nil, ErrTokenNotFound
	}
	if token.Type == structs.ACLManagementToken {
		return &Identity{ACL: acl.ManagementACL, Token: token}, nil
	}
	a, err := aclForPolicies(st, token.Policies)
	if err != nil {
		return nil, err
	}
	return &Identity{ACL: a, Token: token}, nil
}

// aclForPolicies compiles the named policies that exist; a policy that
// was deleted grants nothing.
func aclForPolicies(st *state.StateStore, names []string) (*acl.ACL, error) {
	var parsed []*acl.Policy
	for _, name := range names {
		p, err := st.ACLPolicyByName(nil, name)
		if err != nil {
			return nil, err
		}
		if p == nil {
			continue
		}
		pp, err := acl.Parse(p.Rules)
		if err != nil {
			// Stored rules were checked when written; a policy that no
			// longer parses grants nothing rather than failing every call.
			continue
		}
		parsed = append(parsed, pp)
	}
	if len(parsed) == 0 {
		return acl.DenyAll, nil
	}
	return acl.New(parsed), nil
}

// authorizeRPC is the one place every RPC is checked, before its handler
// runs, on whichever server receives it (a forwarded call is checked
// again by the server it is forwarded to).
func (s *Server) authorizeRPC(method string, args any) error {
	if !s.config.ACLEnabled {
		return nil
	}
	rule, ok := rpcACLRules[method]
	if !ok {
		// A method without a row is refused: the table is the allow list.
		return fmt.Errorf("%w: %s has no acl rule", structs.ErrPermissionDenied, method)
	}
	if rule.exempt != "" {
		return nil
	}
	var secret string
	if tr, ok := args.(structs.TokenRequest); ok {
		secret = tr.RequestToken()
	}
	id, err := s.ResolveToken(secret)
	if err != nil {
		if errors.Is(err, structs.ErrPermissionDenied) {
			s.logger.Debug("rpc denied", "method", method, "reason", "token not found")
		}
		return err
	}
	if !rule.allow(id, args) {
		s.logger.Debug("rpc denied", "method", method, "accessor", id.Accessor())
		return fmt.Errorf("%w", structs.ErrPermissionDenied)
	}
	return nil
}

// aclRule is what one RPC needs. exempt, when set, says why the method is
// not checked against a token: "server" (only servers call it; mutual TLS
// guards it), "node" (the endpoint checks the caller's node secret),
// "open" (it reveals nothing and changes nothing).
type aclRule struct {
	exempt string
	allow  func(id *Identity, args any) bool
}

func nsCap(capability string) aclRule {
	return aclRule{allow: func(id *Identity, _ any) bool {
		return id.ACL.AllowNamespaceOperation(structs.DefaultNamespace, capability)
	}}
}

func coarse(fn func(*acl.ACL) bool) aclRule {
	return aclRule{allow: func(id *Identity, _ any) bool { return fn(id.ACL) }}
}

var managementOnly = coarse((*acl.ACL).IsManagement)

// rpcACLRules maps every RPC to what it needs. TestACL_RPCTableCoversEveryMethod
// fails when a registered method has no row.
var rpcACLRules = map[string]aclRule{
	"Status.Ping":       {exempt: "open"},
	"Status.Leader":     {exempt: "open"},
	"Status.Peers":      {exempt: "open"},
	"Status.Leadership": coarse((*acl.ACL).AllowOperatorRead),
	// Members answers /v1/agent/members (node read, as in Nomad) and
	// part of /v1/agent/self (agent read).
	"Status.Members": coarse(func(a *acl.ACL) bool { return a.AllowNodeRead() || a.AllowAgentRead() }),
	"Status.Join":    {exempt: "server"},
	// A CPU profile costs the server, and a goroutine dump shows what it
	// is doing: agent:write, as Nomad's /v1/agent/pprof asks.
	"Agent.Profile":      coarse((*acl.ACL).AllowAgentWrite),
	"Status.HasNodeConn": {exempt: "server"},
	"Status.CancelQuery": {exempt: "open"},
	"ClientRPC.Forward":  {exempt: "server"},

	"Node.Register":        {exempt: "node"},
	"Node.UpdateStatus":    {exempt: "node"},
	"Node.GetClientAllocs": {exempt: "node"},
	"Node.UpdateAlloc":     {exempt: "node"},
	"Node.Deregister": {allow: func(id *Identity, _ any) bool {
		// A node may deregister itself (the endpoint checks which).
		return id.Node != nil || id.ACL.AllowNodeWrite()
	}},
	"Node.List": coarse((*acl.ACL).AllowNodeRead),
	"Node.GetNode": {allow: func(id *Identity, _ any) bool {
		return id.Node != nil || id.ACL.AllowNodeRead()
	}},
	"Node.GetAllocs":         coarse((*acl.ACL).AllowNodeRead),
	"Node.UpdateDrain":       coarse((*acl.ACL).AllowNodeWrite),
	"Node.UpdateEligibility": coarse((*acl.ACL).AllowNodeWrite),

	"Operator.RaftGetConfiguration": coarse((*acl.ACL).AllowOperatorRead),
	"Operator.RaftRemovePeerByID":   coarse((*acl.ACL).AllowOperatorWrite),
	"Operator.TransferLeadership":   coarse((*acl.ACL).AllowOperatorWrite),
	"Operator.SnapshotSave":         managementOnly,
	"Operator.SnapshotRead":         managementOnly,
	"Operator.SnapshotUpload":       managementOnly,
	"Operator.SnapshotRestore":      managementOnly,

	"Job.Register":    {allow: allowJobRegister},
	"Job.Deregister":  nsCap(acl.NamespaceCapabilitySubmitJob),
	"Job.List":        nsCap(acl.NamespaceCapabilityListJobs),
	"Job.GetJob":      nsCap(acl.NamespaceCapabilityReadJob),
	"Job.Allocations": nsCap(acl.NamespaceCapabilityReadJob),
	"Job.Evaluations": nsCap(acl.NamespaceCapabilityReadJob),
	"Alloc.List":      nsCap(acl.NamespaceCapabilityReadJob),
	// The logs and fs routes read the allocation to find its task and
	// node.
	"Alloc.GetAlloc": {allow: func(id *Identity, _ any) bool {
		return id.ACL.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilityReadJob) ||
			id.ACL.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilityReadLogs) ||
			id.ACL.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilityReadFS)
	}},
	"Alloc.Logs":   nsCap(acl.NamespaceCapabilityReadLogs),
	"Alloc.Stats":  nsCap(acl.NamespaceCapabilityReadJob),
	"Alloc.FS":     nsCap(acl.NamespaceCapabilityReadFS),
	"Eval.List":    nsCap(acl.NamespaceCapabilityReadJob),
	"Eval.GetEval": nsCap(acl.NamespaceCapabilityReadJob),

	"CSIVolume.Claim":          {exempt: "node"},
	"CSIVolume.Register":       nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.Deregister":     nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.Create":         nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.Delete":         nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.Unpublish":      nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.CreateSnapshot": nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.DeleteSnapshot": nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.ListSnapshots":  nsCap(acl.NamespaceCapabilityCSIListVolume),
	"CSIVolume.List":           nsCap(acl.NamespaceCapabilityCSIListVolume),
	"CSIVolume.ListExternal":   nsCap(acl.NamespaceCapabilityCSIListVolume),
	"CSIVolume.Expand":         nsCap(acl.NamespaceCapabilityCSIWriteVolume),
	"CSIVolume.Get":            nsCap(acl.NamespaceCapabilityCSIReadVolume),
	"CSIPlugin.List":           coarse((*acl.ACL).AllowPluginList),
	"CSIPlugin.Get":            coarse((*acl.ACL).AllowPluginRead),
	"CSIPlugin.Lanes":          coarse((*acl.ACL).AllowPluginRead),

	"ACL.Bootstrap":      {exempt: "open"}, // once only, or with the reset index
	"ACL.UpsertPolicies": managementOnly,
	"ACL.DeletePolicies": managementOnly,
	"ACL.ListPolicies":   managementOnly,
	"ACL.GetPolicy":      managementOnly,
	"ACL.UpsertTokens":   managementOnly,
	"ACL.DeleteTokens":   managementOnly,
	"ACL.ListTokens":     managementOnly,
	"ACL.GetToken":       managementOnly,
	// ResolveToken answers only about the caller's own token.
	"ACL.ResolveToken": {exempt: "open"},
}

// allowJobRegister needs submit-job and, for a job that mounts a CSI
// volume, csi-mount-volume: checked at submission, as Nomad does.
func allowJobRegister(id *Identity, args any) bool {
	a := id.ACL
	if !a.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilitySubmitJob) {
		return false
	}
	req, ok := args.(*structs.JobRegisterRequest)
	if !ok || req.Job == nil {
		return true // the endpoint refuses it as malformed
	}
	for _, tg := range req.Job.TaskGroups {
		if tg == nil {
			continue
		}
		for _, v := range tg.Volumes {
			// Every volume a group can request is a CSI volume.
			if v != nil && !a.AllowNamespaceOperation(structs.DefaultNamespace, acl.NamespaceCapabilityCSIMountVolume) {
				return false
			}
		}
	}
	return true
}
