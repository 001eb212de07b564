package nomad

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/structs"
)

// testACLServer starts a leader with ACLs on and returns it with the
// bootstrap (management) secret.
func testACLServer(t *testing.T, fn func(*Config)) (*Server, string) {
	t.Helper()
	s := testServer(t, func(c *Config) {
		c.ACLEnabled = true
		if fn != nil {
			fn(c)
		}
	})
	waitForLeader(t, s)
	var resp structs.ACLTokenUpsertResponse
	must.NoError(t, s.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{}, &resp))
	must.Len(t, 1, resp.Tokens)
	must.Eq(t, structs.ACLManagementToken, resp.Tokens[0].Type)
	return s, resp.Tokens[0].SecretID
}

// testACLToken writes a policy with rules and returns the secret of a
// client token holding it.
func testACLToken(t testing.TB, s *Server, mgmt, name, rules string) string {
	t.Helper()
	var gr structs.GenericResponse
	must.NoError(t, s.RPC("ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{
		Policies:     []*structs.ACLPolicy{{Name: name, Rules: rules}},
		WriteRequest: structs.WriteRequest{AuthToken: mgmt},
	}, &gr))
	var tr structs.ACLTokenUpsertResponse
	must.NoError(t, s.RPC("ACL.UpsertTokens", &structs.ACLTokenUpsertRequest{
		Tokens:       []*structs.ACLToken{{Name: name, Type: structs.ACLClientToken, Policies: []string{name}}},
		WriteRequest: structs.WriteRequest{AuthToken: mgmt},
	}, &tr))
	must.Len(t, 1, tr.Tokens)
	return tr.Tokens[0].SecretID
}

// rpcACLCase is one RPC's row: rules that allow it, and near-miss rules
// that must not. grant "management" means only a management token;
// exempt rows are the methods not checked against a token (see
// rpcACLRules).
type rpcACLCase struct {
	grant, near string
	exempt      string
}

const nsRead = `namespace "default" { policy = "read" }`

func nsCaps(caps ...string) string {
	return `namespace "default" { capabilities = ["` + strings.Join(caps, `","`) + `"] }`
}

// rpcACLCases has a row for every RPC a server registers;
// TestACL_RPCTable fails when a method has none.
var rpcACLCases = map[string]rpcACLCase{
	"Status.Ping":        {exempt: "open"},
	"Status.Leader":      {exempt: "open"},
	"Status.Peers":       {exempt: "open"},
	"Status.CancelQuery": {exempt: "open"},
	"Status.Join":        {exempt: "server"},
	"Status.HasNodeConn": {exempt: "server"},
	"ClientRPC.Forward":  {exempt: "server"},
	"Status.Members":     {grant: `node { policy = "read" }`, near: `operator { policy = "write" }`},
	"Agent.Profile":      {grant: `agent { policy = "write" }`, near: `agent { policy = "read" }`},

	"Node.Register":          {exempt: "node"},
	"Node.UpdateStatus":      {exempt: "node"},
	"Node.GetClientAllocs":   {exempt: "node"},
	"Node.UpdateAlloc":       {exempt: "node"},
	"Node.Deregister":        {grant: `node { policy = "write" }`, near: `node { policy = "read" }`},
	"Node.List":              {grant: `node { policy = "read" }`, near: `agent { policy = "write" }`},
	"Node.GetNode":           {grant: `node { policy = "read" }`, near: `agent { policy = "write" }`},
	"Node.GetAllocs":         {grant: `node { policy = "read" }`, near: nsRead},
	"Node.UpdateDrain":       {grant: `node { policy = "write" }`, near: `node { policy = "read" }`},
	"Node.UpdateEligibility": {grant: `node { policy = "write" }`, near: `node { policy = "read" }`},

	"Operator.RaftGetConfiguration": {grant: `operator { policy = "read" }`, near: `agent { policy = "write" }`},
	"Operator.RaftRemovePeerByID":   {grant: `operator { policy = "write" }`, near: `operator { policy = "read" }`},
	"Operator.TransferLeadership":   {grant: `operator { policy = "write" }`, near: `operator { policy = "read" }`},
	"Operator.SnapshotSave":         {grant: "management", near: `operator { policy = "write" }`},
	"Operator.SnapshotRead":         {grant: "management", near: `operator { policy = "write" }`},
	"Operator.SnapshotUpload":       {grant: "management", near: `operator { policy = "write" }`},
	"Operator.SnapshotRestore":      {grant: "management", near: `operator { policy = "write" }`},

	"Job.Register":    {grant: nsCaps("submit-job"), near: nsRead},
	"Job.Deregister":  {grant: nsCaps("submit-job"), near: nsRead},
	"Job.List":        {grant: nsCaps("list-jobs"), near: nsCaps("read-logs")},
	"Job.GetJob":      {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},
	"Job.Allocations": {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},
	"Job.Evaluations": {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},
	"Alloc.List":      {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},
	"Alloc.GetAlloc":  {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},
	"Eval.List":       {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},
	"Eval.GetEval":    {grant: nsCaps("read-job"), near: nsCaps("list-jobs")},

	"CSIVolume.Claim":          {exempt: "node"},
	"CSIVolume.Register":       {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "submit-job", "csi-read-volume")},
	"CSIVolume.Deregister":     {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "submit-job", "csi-read-volume")},
	"CSIVolume.Create":         {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "submit-job")},
	"CSIVolume.Delete":         {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "submit-job")},
	"CSIVolume.Unpublish":      {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "submit-job")},
	"CSIVolume.CreateSnapshot": {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "csi-read-volume")},
	"CSIVolume.DeleteSnapshot": {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "csi-read-volume")},
	"CSIVolume.ListSnapshots":  {grant: nsCaps("csi-list-volume"), near: nsCaps("list-jobs")},
	"CSIVolume.List":           {grant: nsCaps("csi-list-volume"), near: nsCaps("csi-read-volume")},
	"CSIVolume.ListExternal":   {grant: nsCaps("csi-list-volume"), near: nsCaps("csi-read-volume")},
	"CSIVolume.Expand":         {grant: nsCaps("csi-write-volume"), near: nsCaps("csi-mount-volume", "csi-read-volume")},
	"Alloc.Logs":               {grant: nsCaps("read-logs"), near: nsCaps("read-job")},
	"Alloc.Stats":              {grant: nsCaps("read-job"), near: nsCaps("read-logs", "read-fs")},
	"Alloc.FS":                 {grant: nsCaps("read-fs"), near: nsCaps("read-job", "read-logs")},
	"CSIVolume.Get":            {grant: nsCaps("csi-read-volume"), near: nsCaps("csi-list-volume")},
	"CSIPlugin.List":           {grant: `plugin { policy = "list" }`, near: nsRead},
	"CSIPlugin.Lanes":          {grant: `plugin { policy = "read" }`, near: `plugin { policy = "list" }`},
	"Status.Leadership":        {grant: `operator { policy = "read" }`, near: `agent { policy = "write" }`},
	"CSIPlugin.Get":            {grant: `plugin { policy = "read" }`, near: `plugin { policy = "list" }`},

	"ACL.Bootstrap":      {exempt: "open"},
	"ACL.ResolveToken":   {exempt: "open"},
	"ACL.UpsertPolicies": {grant: "management", near: `operator { policy = "write" }`},
	"ACL.DeletePolicies": {grant: "management", near: `operator { policy = "write" }`},
	"ACL.ListPolicies":   {grant: "management", near: `operator { policy = "write" }`},
	"ACL.GetPolicy":      {grant: "management", near: `operator { policy = "write" }`},
	"ACL.UpsertTokens":   {grant: "management", near: `operator { policy = "write" }`},
	"ACL.DeleteTokens":   {grant: "management", near: `operator { policy = "write" }`},
	"ACL.ListTokens":     {grant: "management", near: `operator { policy = "write" }`},
	"ACL.GetToken":       {grant: "management", near: `operator { policy = "write" }`},
}

// TestACL_RPCTable checks every registered RPC against a token with what
// it needs (allowed), a token with a near miss, the anonymous token and an
// unknown secret (all permission denied). A method without a row in
// rpcACLCases, or without a rule in rpcACLRules, fails the test.
func TestACL_RPCTable(t *testing.T) {
	t.Parallel()
	s, mgmt := testACLServer(t, nil)
	methods := s.rpcServer.Methods()
	must.SliceNotEmpty(t, methods)

	req := func(secret string) any {
		return &structs.GenericRequest{QueryOptions: structs.QueryOptions{AuthToken: secret}}
	}
	for i, m := range methods {
		tc, ok := rpcACLCases[m]
		if !ok {
			t.Errorf("rpc %s has no row in rpcACLCases: say what it needs", m)
			continue
		}
		rule, ok := rpcACLRules[m]
		if !ok {
			t.Errorf("rpc %s has no rule in rpcACLRules", m)
			continue
		}
		t.Run(m, func(t *testing.T) {
			if tc.exempt != "" {
				must.Eq(t, tc.exempt, rule.exempt)
				must.NoError(t, s.authorizeRPC(m, req("")))
				return
			}
			must.Eq(t, "", rule.exempt)
			must.NoError(t, s.authorizeRPC(m, req(mgmt)))
			if tc.grant != "management" {
				granted := testACLToken(t, s, mgmt, "grant-"+strconv.Itoa(i), tc.grant)
				must.NoError(t, s.authorizeRPC(m, req(granted)))
			}
			near := testACLToken(t, s, mgmt, "near-"+strconv.Itoa(i), tc.near)
			for name, secret := range map[string]string{"near miss": near, "anonymous": "", "unknown": "a8f1c0de-0000-4000-8000-000000000000"} {
				err := s.authorizeRPC(m, req(secret))
				must.True(t, errors.Is(err, structs.ErrPermissionDenied), must.Sprintf("%s: %v", name, err))
			}
		})
	}
	for m := range rpcACLRules {
		must.SliceContains(t, methods, m, must.Sprintf("rpcACLRules names %s, which is not registered", m))
	}
}

// TestACL_EnforcedOnTheWire checks that the table is applied to real
// calls, not only when asked: a denied call never reaches its handler.
func TestACL_EnforcedOnTheWire(t *testing.T) {
	s, mgmt := testACLServer(t, nil)
	var list structs.JobListResponse
	err := s.RPC("Job.List", &structs.JobListRequest{}, &list)
	must.True(t, errors.Is(err, structs.ErrPermissionDenied), must.Sprint(err))
	must.NoError(t, s.RPC("Job.List", &structs.JobListRequest{QueryOptions: structs.QueryOptions{AuthToken: mgmt}}, &list))

	// A node's own secret keeps working for its node RPCs.
	n := testNode("acl-node")
	registerNode(t, s, n)
	var nu structs.NodeUpdateResponse
	must.NoError(t, s.RPC("Node.UpdateStatus", &structs.NodeUpdateStatusRequest{
		NodeID: n.ID, Status: structs.NodeStatusReady,
		WriteRequest: structs.WriteRequest{AuthToken: n.SecretID},
	}, &nu))
	// ...but is not an ACL token.
	err = s.RPC("Job.List", &structs.JobListRequest{QueryOptions: structs.QueryOptions{AuthToken: n.SecretID}}, &list)
	must.True(t, errors.Is(err, structs.ErrPermissionDenied), must.Sprint(err))
}

func csiJob(withVolume bool, secret string) *structs.JobRegisterRequest {
	tg := &structs.TaskGroup{Name: "g"}
	if withVolume {
		tg.Volumes = map[string]*structs.VolumeRequest{"data": {Name: "data", Type: "csi", Source: "vol1"}}
	}
	return &structs.JobRegisterRequest{
		Job:          &structs.Job{ID: "j", TaskGroups: []*structs.TaskGroup{tg}},
		WriteRequest: structs.WriteRequest{AuthToken: secret},
	}
}

// TestACL_JobRegisterNeedsMountForCSI: mounting a CSI volume needs
// csi-mount-volume at submission.
func TestACL_JobRegisterNeedsMountForCSI(t *testing.T) {
	s, mgmt := testACLServer(t, nil)
	submit := testACLToken(t, s, mgmt, "submit", nsCaps("submit-job"))
	mount := testACLToken(t, s, mgmt, "mount", nsCaps("submit-job", "csi-mount-volume"))
	onlyMount := testACLToken(t, s, mgmt, "only-mount", nsCaps("csi-mount-volume"))

	must.NoError(t, s.authorizeRPC("Job.Register", csiJob(false, submit)))
	err := s.authorizeRPC("Job.Register", csiJob(true, submit))
	must.True(t, errors.Is(err, structs.ErrPermissionDenied), must.Sprint(err))
	must.NoError(t, s.authorizeRPC("Job.Register", csiJob(true, mount)))
	err = s.authorizeRPC("Job.Register", csiJob(true, onlyMount))
	must.True(t, errors.Is(err, structs.ErrPermissionDenied), must.Sprint(err))
}

// TestACL_CacheInvalidatedOnChange: a deleted token, or a policy that
// changed, takes effect on the next call although resolutions are cached.
func TestACL_CacheInvalidatedOnChange(t *testing.T) {
	s, mgmt := testACLServer(t, nil)
	secret := testACLToken(t, s, mgmt, "p", nsCaps("list-jobs"))
	list := func(secret string) error {
		return s.authorizeRPC("Job.List", &structs.JobListRequest{QueryOptions: structs.QueryOptions{AuthToken: secret}})
	}
	must.NoError(t, list(secret))
	must.NoError(t, list(secret)) // cached now

	// The policy loses the capability.
	var gr structs.GenericResponse
	must.NoError(t, s.RPC("ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{
		Policies:     []*structs.ACLPolicy{{Name: "p", Rules: nsCaps("read-logs")}},
		WriteRequest: structs.WriteRequest{AuthToken: mgmt},
	}, &gr))
	must.True(t, errors.Is(list(secret), structs.ErrPermissionDenied))

	// The token is deleted.
	must.NoError(t, s.RPC("ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{
		Policies:     []*structs.ACLPolicy{{Name: "p", Rules: nsCaps("list-jobs")}},
		WriteRequest: structs.WriteRequest{AuthToken: mgmt},
	}, &gr))
	must.NoError(t, list(secret))
	id, err := s.ResolveToken(secret)
	must.NoError(t, err)
	must.NoError(t, s.RPC("ACL.DeleteTokens", &structs.ACLTokenDeleteRequest{
		AccessorIDs:  []string{id.Token.AccessorID},
		WriteRequest: structs.WriteRequest{AuthToken: mgmt},
	}, &gr))
	err = list(secret)
	must.True(t, errors.Is(err, ErrTokenNotFound), must.Sprint(err))

	// The anonymous policy grants what it says, from the next call.
	must.True(t, errors.Is(list(""), structs.ErrPermissionDenied))
	must.NoError(t, s.RPC("ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{
		Policies:     []*structs.ACLPolicy{{Name: structs.AnonymousPolicyName, Rules: nsCaps("list-jobs")}},
		WriteRequest: structs.WriteRequest{AuthToken: mgmt},
	}, &gr))
	must.NoError(t, list(""))
}

// TestACL_BootstrapOnceAndReset: a second bootstrap is refused, naming
// the reset index; the reset file with that index allows one more.
func TestACL_BootstrapOnceAndReset(t *testing.T) {
	var dataDir string
	s, first := testACLServer(t, func(c *Config) { dataDir = c.DataDir })
	var resp structs.ACLTokenUpsertResponse
	err := s.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{}, &resp)
	must.True(t, errors.Is(err, structs.ErrInvalidRequest), must.Sprint(err))
	must.StrContains(t, err.Error(), "acl bootstrap already done (reset index: ")
	// A caller cannot name the reset index itself.
	idx, perr := strconv.ParseUint(strings.TrimSuffix(strings.SplitAfter(err.Error(), "reset index: ")[1], ")"), 10, 64)
	must.NoError(t, perr)
	err = s.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{ResetIndex: idx}, &resp)
	must.Error(t, err)

	must.NoError(t, os.WriteFile(filepath.Join(dataDir, ACLBootstrapResetFile), []byte(strconv.FormatUint(idx, 10)+"\n"), 0o600))
	must.NoError(t, s.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{}, &resp))
	must.NotEq(t, first, resp.Tokens[0].SecretID)
	// The file's index is used up.
	err = s.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{}, &resp)
	must.True(t, errors.Is(err, structs.ErrInvalidRequest), must.Sprint(err))
}

// TestACL_SecretsNotListedOrLogged: lists carry accessors only, and a
// denial's debug log names the accessor, never the secret.
func TestACL_SecretsNotListedOrLogged(t *testing.T) {
	var logs bytes.Buffer
	s, mgmt := testACLServer(t, func(c *Config) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &logs})
	})
	secret := testACLToken(t, s, mgmt, "p", nsCaps("read-logs"))
	var list structs.ACLTokenListResponse
	must.NoError(t, s.RPC("ACL.ListTokens", &structs.GenericRequest{QueryOptions: structs.QueryOptions{AuthToken: mgmt}}, &list))
	must.Len(t, 2, list.Tokens)

	err := s.RPC("Job.List", &structs.JobListRequest{QueryOptions: structs.QueryOptions{AuthToken: secret}}, &structs.JobListResponse{})
	must.True(t, errors.Is(err, structs.ErrPermissionDenied))
	must.StrNotContains(t, err.Error(), secret)
	id, err := s.ResolveToken(secret)
	must.NoError(t, err)
	must.StrContains(t, logs.String(), id.Token.AccessorID)
	must.StrContains(t, logs.String(), "Job.List")
	must.StrNotContains(t, logs.String(), secret)
	must.StrNotContains(t, logs.String(), mgmt)
}

// TestACL_SnapshotCarriesTokens: a Raft snapshot restores policies,
// tokens and the bootstrap mark.
func TestACL_SnapshotCarriesTokens(t *testing.T) {
	s, mgmt := testACLServer(t, nil)
	secret := testACLToken(t, s, mgmt, "p", nsCaps("list-jobs"))
	snap, err := s.fsm.Snapshot()
	must.NoError(t, err)
	var buf bytes.Buffer
	must.NoError(t, snap.(*fsmSnapshot).persist(&buf))
	fresh, counts, err := restoreStore(&buf)
	must.NoError(t, err)
	must.Eq(t, 1, counts["acl_policies"])
	must.Eq(t, 2, counts["acl_tokens"])
	tok, err := fresh.ACLTokenBySecretID(nil, secret)
	must.NoError(t, err)
	must.NotNil(t, tok)
	id, err := resolveFromState(fresh, secret)
	must.NoError(t, err)
	must.True(t, id.ACL.AllowNamespaceOperation("default", "list-jobs"))
	// The bootstrap is remembered: a second one is still refused.
	must.Error(t, fresh.BootstrapACLToken(1<<40, 0, &structs.ACLToken{AccessorID: "a", SecretID: "b", Type: structs.ACLManagementToken}))
}

// TestACL_BadInput: every ACL write checks what it is given, names the
// problem, and writes nothing.
func TestACL_BadInput(t *testing.T) {
	s, mgmt := testACLServer(t, nil)
	w := structs.WriteRequest{AuthToken: mgmt}
	var gr structs.GenericResponse
	var tr structs.ACLTokenUpsertResponse
	cases := []struct {
		name, method string
		args         any
		reply        any
		want         string
	}{
		{"no policies", "ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{WriteRequest: w}, &gr, "give 1 to"},
		{"bad name", "ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{Policies: []*structs.ACLPolicy{{Name: "../x", Rules: nsCaps("list-jobs")}}, WriteRequest: w}, &gr, "only letters"},
		{"bad rules", "ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{Policies: []*structs.ACLPolicy{{Name: "x", Rules: nsCaps("fly")}}, WriteRequest: w}, &gr, `unknown capability "fly"`},
		{"null policy", "ACL.UpsertPolicies", &structs.ACLPolicyUpsertRequest{Policies: []*structs.ACLPolicy{nil}, WriteRequest: w}, &gr, "null"},
		{"missing policy", "ACL.UpsertTokens", &structs.ACLTokenUpsertRequest{Tokens: []*structs.ACLToken{{Type: "client", Policies: []string{"nope"}}}, WriteRequest: w}, &tr, `cannot find policy "nope"`},
		{"client without policies", "ACL.UpsertTokens", &structs.ACLTokenUpsertRequest{Tokens: []*structs.ACLToken{{Type: "client"}}, WriteRequest: w}, &tr, "missing policies"},
		{"management with policies", "ACL.UpsertTokens", &structs.ACLTokenUpsertRequest{Tokens: []*structs.ACLToken{{Type: "management", Policies: []string{"x"}}}, WriteRequest: w}, &tr, "cannot be associated"},
		{"bad type", "ACL.UpsertTokens", &structs.ACLTokenUpsertRequest{Tokens: []*structs.ACLToken{{Type: "root"}}, WriteRequest: w}, &tr, "token type"},
		{"unknown accessor", "ACL.UpsertTokens", &structs.ACLTokenUpsertRequest{Tokens: []*structs.ACLToken{{AccessorID: "nope", Type: "management"}}, WriteRequest: w}, &tr, "not found"},
		{"delete missing", "ACL.DeleteTokens", &structs.ACLTokenDeleteRequest{AccessorIDs: []string{"nope"}, WriteRequest: w}, &gr, "not found"},
	}
	before, err := aclTablesIndex(s.State())
	must.NoError(t, err)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := s.RPC(tc.method, tc.args, tc.reply)
			must.Error(t, err)
			must.StrContains(t, err.Error(), tc.want)
		})
	}
	after, err := aclTablesIndex(s.State())
	must.NoError(t, err)
	// "delete missing" reaches Raft and fails at apply, changing nothing.
	tokens, err := s.State().ACLTokens(nil)
	must.NoError(t, err)
	must.Len(t, 1, tokens)
	policies, err := s.State().ACLPolicies(nil)
	must.NoError(t, err)
	must.Len(t, 0, policies)
	must.Eq(t, before, after)
}

// TestACL_Disabled: with ACLs off every call is allowed as before, and
// the ACL endpoints say ACLs are off.
func TestACL_Disabled(t *testing.T) {
	s := testServer(t, nil)
	waitForLeader(t, s)
	must.NoError(t, s.authorizeRPC("Operator.SnapshotSave", &structs.GenericRequest{}))
	var resp structs.ACLTokenUpsertResponse
	err := s.RPC("ACL.Bootstrap", &structs.ACLTokenBootstrapRequest{}, &resp)
	must.True(t, errors.Is(err, structs.ErrInvalidRequest), must.Sprint(err))
	must.StrContains(t, err.Error(), "acl support disabled")
}
