package structs

import (
	"fmt"
	"time"
)

// Token types.
const (
	ACLClientToken     = "client"
	ACLManagementToken = "management"
)

// AnonymousPolicyName is the policy that applies to a request without a
// token, when it exists.
const AnonymousPolicyName = "anonymous"

// ACL limits: every input is bounded.
const (
	MaxACLPolicyNameLen   = 128
	MaxACLPolicyDescLen   = 256
	MaxACLTokenNameLen    = 256
	MaxACLTokenPolicies   = 64
	MaxACLObjectsPerWrite = 64
)

// TokenRequest is implemented by every request: the secret it carries.
type TokenRequest interface {
	RequestToken() string
}

// ACLPolicy is a named policy document, in Nomad's shape.
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

// Stub returns p without its rules.
func (p *ACLPolicy) Stub() *ACLPolicyListStub {
	return &ACLPolicyListStub{Name: p.Name, Description: p.Description, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex}
}

// ValidateName checks a policy name: letters, digits, '-' and '_'.
func ValidACLPolicyName(name string) error {
	if name == "" || len(name) > MaxACLPolicyNameLen {
		return fmt.Errorf("%w: policy name must be 1 to %d characters", ErrInvalidRequest, MaxACLPolicyNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("%w: policy name %q: only letters, digits, '-' and '_' are allowed", ErrInvalidRequest, name)
		}
	}
	return nil
}

// ACLToken is a token: its AccessorID is public, its SecretID is the
// credential and is never logged.
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

// ACLTokenListStub is a token without its secret, for lists.
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

// Stub returns t without its secret.
func (t *ACLToken) Stub() *ACLTokenListStub {
	return &ACLTokenListStub{
		AccessorID: t.AccessorID, Name: t.Name, Type: t.Type,
		Policies: append([]string(nil), t.Policies...), Global: t.Global,
		CreateTime: t.CreateTime, CreateIndex: t.CreateIndex, ModifyIndex: t.ModifyIndex,
	}
}

// Copy returns a deep copy of t.
func (t *ACLToken) Copy() *ACLToken {
	c := *t
	c.Policies = append([]string(nil), t.Policies...)
	return &c
}

// Validate checks a token as a caller submits it (IDs are the server's).
func (t *ACLToken) Validate() error {
	if len(t.Name) > MaxACLTokenNameLen {
		return fmt.Errorf("%w: token name longer than %d characters", ErrInvalidRequest, MaxACLTokenNameLen)
	}
	switch t.Type {
	case ACLClientToken:
		if len(t.Policies) == 0 {
			return fmt.Errorf("%w: client token missing policies", ErrInvalidRequest)
		}
	case ACLManagementToken:
		if len(t.Policies) != 0 {
			return fmt.Errorf("%w: management token cannot be associated with policies", ErrInvalidRequest)
		}
	default:
		return fmt.Errorf("%w: token type must be %q or %q, not %q", ErrInvalidRequest, ACLClientToken, ACLManagementToken, t.Type)
	}
	if len(t.Policies) > MaxACLTokenPolicies {
		return fmt.Errorf("%w: token has %d policies, more than the limit of %d", ErrInvalidRequest, len(t.Policies), MaxACLTokenPolicies)
	}
	for _, p := range t.Policies {
		if err := ValidACLPolicyName(p); err != nil {
			return err
		}
	}
	return nil
}

// ACLPolicyUpsertRequest writes policies.
type ACLPolicyUpsertRequest struct {
	Policies []*ACLPolicy
	WriteRequest
}

// ACLPolicyDeleteRequest deletes policies by name.
type ACLPolicyDeleteRequest struct {
	Names []string
	WriteRequest
}

// ACLPolicySpecificRequest reads one policy.
type ACLPolicySpecificRequest struct {
	Name string
	QueryOptions
}

// ACLPolicyResponse answers a policy read; Policy is nil when absent.
type ACLPolicyResponse struct {
	Policy *ACLPolicy
	QueryMeta
}

// ACLPolicyListResponse answers a policy list.
type ACLPolicyListResponse struct {
	Policies []*ACLPolicyListStub
	QueryMeta
}

// ACLTokenUpsertRequest writes tokens; the server fills in IDs for new ones.
type ACLTokenUpsertRequest struct {
	Tokens []*ACLToken
	WriteRequest
}

// ACLTokenUpsertResponse returns the tokens as stored, with secrets.
type ACLTokenUpsertResponse struct {
	Tokens []*ACLToken
	WriteMeta
}

// ACLTokenDeleteRequest deletes tokens by accessor.
type ACLTokenDeleteRequest struct {
	AccessorIDs []string
	WriteRequest
}

// ACLTokenBootstrapRequest creates the first management token. ResetIndex,
// when set, must match the reset file on the leader (see docs/acl.md).
type ACLTokenBootstrapRequest struct {
	Token      *ACLToken
	ResetIndex uint64
	WriteRequest
}

// ACLTokenSpecificRequest reads one token by accessor.
type ACLTokenSpecificRequest struct {
	AccessorID string
	QueryOptions
}

// ACLTokenResponse answers a token read; Token is nil when absent.
type ACLTokenResponse struct {
	Token *ACLToken
	QueryMeta
}

// ACLTokenListResponse answers a token list: accessors only.
type ACLTokenListResponse struct {
	Tokens []*ACLTokenListStub
	QueryMeta
}

// ResolveACLTokenResponse answers ACL.ResolveToken: the caller's token
// (nil for anonymous) and the rules of its policies.
type ResolveACLTokenResponse struct {
	Token    *ACLToken
	Policies []*ACLPolicy
	QueryMeta
}
