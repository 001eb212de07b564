package agent

import (
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

// TestNomadAPI_ACL drives bootstrap, policies and tokens with Nomad's own
// Go client, and requests with its SecretID set.
func TestNomadAPI_ACL(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.ACL = &ACLConfig{Enabled: true} })
	waitForLeader(t, a)
	c := newNomadClient(t, a)

	boot, _, err := c.ACLTokens().Bootstrap(nil)
	must.NoError(t, err)
	must.Eq(t, "management", boot.Type)
	must.NotEq(t, "", boot.SecretID)
	_, _, err = c.ACLTokens().Bootstrap(nil)
	must.ErrorContains(t, err, "acl bootstrap already done")

	// Anonymous: nothing.
	_, _, err = c.Jobs().List(nil)
	must.ErrorContains(t, err, "403")
	must.ErrorContains(t, err, "Permission denied")

	c.SetSecretID(boot.SecretID)
	_, err = c.ACLPolicies().Upsert(&nomadapi.ACLPolicy{
		Name: "readonly", Description: "read jobs",
		Rules: `namespace "default" { policy = "read" }`,
	}, nil)
	must.NoError(t, err)
	list, _, err := c.ACLPolicies().List(nil)
	must.NoError(t, err)
	must.Len(t, 1, list)
	must.Eq(t, "readonly", list[0].Name)
	must.Eq(t, "read jobs", list[0].Description)
	info, _, err := c.ACLPolicies().Info("readonly", nil)
	must.NoError(t, err)
	must.StrContains(t, info.Rules, `policy = "read"`)

	tok, _, err := c.ACLTokens().Create(&nomadapi.ACLToken{Name: "ro", Type: "client", Policies: []string{"readonly"}}, nil)
	must.NoError(t, err)
	must.NotEq(t, "", tok.SecretID)
	must.NotEq(t, "", tok.AccessorID)
	toks, _, err := c.ACLTokens().List(nil)
	must.NoError(t, err)
	must.Len(t, 2, toks)
	got, _, err := c.ACLTokens().Info(tok.AccessorID, nil)
	must.NoError(t, err)
	must.Eq(t, []string{"readonly"}, got.Policies)
	tok.Name = "ro2"
	upd, _, err := c.ACLTokens().Update(tok, nil)
	must.NoError(t, err)
	must.Eq(t, "ro2", upd.Name)

	// A request with the read-only token set.
	ro := newNomadClient(t, a)
	ro.SetSecretID(tok.SecretID)
	_, _, err = ro.Jobs().List(nil)
	must.NoError(t, err)
	self, _, err := ro.ACLTokens().Self(nil)
	must.NoError(t, err)
	must.Eq(t, tok.AccessorID, self.AccessorID)
	mine, _, err := ro.ACLPolicies().Self(nil)
	must.NoError(t, err)
	must.Len(t, 1, mine)
	_, _, err = ro.ACLPolicies().List(nil)
	must.ErrorContains(t, err, "Permission denied")
	_, _, err = ro.Nodes().List(nil)
	must.ErrorContains(t, err, "Permission denied")

	_, err = c.ACLTokens().Delete(tok.AccessorID, nil)
	must.NoError(t, err)
	_, _, err = ro.Jobs().List(nil)
	must.ErrorContains(t, err, "403")
	_, err = c.ACLPolicies().Delete("readonly", nil)
	must.NoError(t, err)
	_, _, err = c.ACLPolicies().Info("readonly", nil)
	must.ErrorContains(t, err, "404")
}
