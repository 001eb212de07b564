package api

import (
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// ACLPolicy is a named policy, in Nomad's JSON.
type ACLPolicy struct {
	Name        string
	Description string
	Rules       string
	CreateIndex uint64
	ModifyIndex uint64
}

// ACLPolicyListStub is a policy without its rules.
type ACLPolicyListStub struct {
	Name        string
	Description string
	CreateIndex uint64
	ModifyIndex uint64
}

// ACLToken is a token; SecretID is set only in answers that may carry it.
type ACLToken struct {
	AccessorID  string
	SecretID    string
	Name        string
	Type        string
	Policies    []string
	Global      bool
	CreateTime  time.Time
	CreateIndex uint64
	ModifyIndex uint64
}

// ACLTokenListStub is a token without its secret.
type ACLTokenListStub struct {
	AccessorID  string
	Name        string
	Type        string
	Policies    []string
	Global      bool
	CreateTime  time.Time
	CreateIndex uint64
	ModifyIndex uint64
}

// ACL is a handle on the /v1/acl endpoints.
type ACL struct{ c *Client }

// ACL returns a handle on the ACL endpoints.
func (c *Client) ACL() *ACL { return &ACL{c} }

func escapeName(kind, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("api: missing %s", kind)
	}
	return url.PathEscape(name), nil
}

// Bootstrap creates the first management token.
func (a *ACL) Bootstrap(w *WriteOptions) (*ACLToken, error) {
	var out ACLToken
	if _, err := a.c.write(http.MethodPut, "/v1/acl/bootstrap", nil, nil, &out, w); err != nil {
		return nil, err
	}
	return &out, nil
}

// PolicyApply writes a policy.
func (a *ACL) PolicyApply(p *ACLPolicy, w *WriteOptions) error {
	name, err := escapeName("policy name", p.Name)
	if err != nil {
		return err
	}
	_, err = a.c.write(http.MethodPut, "/v1/acl/policy/"+name, nil, p, nil, w)
	return err
}

// Policies lists policies.
func (a *ACL) Policies(q *QueryOptions) ([]*ACLPolicyListStub, error) {
	var out []*ACLPolicyListStub
	_, err := a.c.query("/v1/acl/policies", &out, q)
	return out, err
}

// PolicyInfo reads one policy.
func (a *ACL) PolicyInfo(name string, q *QueryOptions) (*ACLPolicy, error) {
	esc, err := escapeName("policy name", name)
	if err != nil {
		return nil, err
	}
	var out ACLPolicy
	if _, err := a.c.query("/v1/acl/policy/"+esc, &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// PolicyDelete deletes a policy.
func (a *ACL) PolicyDelete(name string, w *WriteOptions) error {
	esc, err := escapeName("policy name", name)
	if err != nil {
		return err
	}
	_, err = a.c.write(http.MethodDelete, "/v1/acl/policy/"+esc, nil, nil, nil, w)
	return err
}

// TokenCreate creates a token; the answer carries its secret.
func (a *ACL) TokenCreate(t *ACLToken, w *WriteOptions) (*ACLToken, error) {
	var out ACLToken
	if _, err := a.c.write(http.MethodPut, "/v1/acl/token", nil, t, &out, w); err != nil {
		return nil, err
	}
	return &out, nil
}

// TokenUpdate changes a token's name or policies.
func (a *ACL) TokenUpdate(t *ACLToken, w *WriteOptions) (*ACLToken, error) {
	esc, err := escapeName("token accessor ID", t.AccessorID)
	if err != nil {
		return nil, err
	}
	var out ACLToken
	if _, err := a.c.write(http.MethodPut, "/v1/acl/token/"+esc, nil, t, &out, w); err != nil {
		return nil, err
	}
	return &out, nil
}

// Tokens lists tokens: accessors, never secrets.
func (a *ACL) Tokens(q *QueryOptions) ([]*ACLTokenListStub, error) {
	var out []*ACLTokenListStub
	_, err := a.c.query("/v1/acl/tokens", &out, q)
	return out, err
}

// TokenInfo reads one token by accessor.
func (a *ACL) TokenInfo(accessor string, q *QueryOptions) (*ACLToken, error) {
	esc, err := escapeName("token accessor ID", accessor)
	if err != nil {
		return nil, err
	}
	var out ACLToken
	if _, err := a.c.query("/v1/acl/token/"+esc, &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// TokenSelf reads the caller's own token.
func (a *ACL) TokenSelf(q *QueryOptions) (*ACLToken, error) {
	var out ACLToken
	if _, err := a.c.query("/v1/acl/token/self", &out, q); err != nil {
		return nil, err
	}
	return &out, nil
}

// TokenDelete deletes a token by accessor.
func (a *ACL) TokenDelete(accessor string, w *WriteOptions) error {
	esc, err := escapeName("token accessor ID", accessor)
	if err != nil {
		return err
	}
	_, err = a.c.write(http.MethodDelete, "/v1/acl/token/"+esc, nil, nil, nil, w)
	return err
}
