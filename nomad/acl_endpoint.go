package nomad

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/acl"
	"github.com/roamhq/roam/state"
	"github.com/roamhq/roam/structs"
)

// ACL serves bootstrap, policies and tokens. Who may call what is in
// rpcACLRules; the methods here only validate and write.
type ACL struct {
	srv *Server
}

// ErrACLDisabled answers ACL calls on a cluster without ACLs.
var ErrACLDisabled = fmt.Errorf("%w: acl support disabled", structs.ErrInvalidRequest)

// ACLBootstrapResetFile, in a server's data dir, holds the reset index
// that allows one more bootstrap (the way back from a lost management
// token; see docs/acl.md).
const ACLBootstrapResetFile = "acl-bootstrap-reset"

// maxResetFileSize bounds the reset file: it holds one number.
const maxResetFileSize = 64

func (a *ACL) enabled() error {
	if !a.srv.config.ACLEnabled {
		return ErrACLDisabled
	}
	return nil
}

// readResetIndex reads the leader's reset file, or 0 when there is none.
func (s *Server) readResetIndex() (uint64, error) {
	if s.config.DataDir == "" {
		return 0, nil
	}
	path := filepath.Join(s.config.DataDir, ACLBootstrapResetFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("acl bootstrap reset file: %w", err)
	}
	defer f.Close()
	buf := make([]byte, maxResetFileSize)
	n, _ := f.Read(buf)
	idx, err := strconv.ParseUint(strings.TrimSpace(string(buf[:n])), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: acl bootstrap reset file %s does not hold an index", structs.ErrInvalidRequest, path)
	}
	return idx, nil
}

// Bootstrap creates the first management token, once. Another bootstrap
// needs the reset file on the leader naming the last bootstrap's index.
func (a *ACL) Bootstrap(args *structs.ACLTokenBootstrapRequest, reply *structs.ACLTokenUpsertResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.Bootstrap", args, args, reply); done {
		return err
	}
	reset, err := a.srv.readResetIndex()
	if err != nil {
		return err
	}
	token := &structs.ACLToken{
		AccessorID: uuid.NewString(),
		SecretID:   uuid.NewString(),
		Name:       "Bootstrap Token",
		Type:       structs.ACLManagementToken,
		Global:     true,
		CreateTime: time.Now().UTC(),
	}
	req := structs.ACLTokenBootstrapRequest{Token: token, ResetIndex: reset}
	_, index, err := a.srv.raftApply(structs.ACLTokenBootstrapRequestType, &req)
	if err != nil {
		if errors.Is(err, state.ErrACLBootstrapDone) {
			return fmt.Errorf("%w: %w", structs.ErrInvalidRequest, err)
		}
		return err
	}
	stored, err := a.srv.State().ACLTokenByAccessorID(nil, token.AccessorID)
	if err != nil {
		return err
	}
	if stored == nil {
		return fmt.Errorf("acl bootstrap: token missing after apply at index %d", index)
	}
	a.srv.logger.Info("acl bootstrap done", "accessor", stored.AccessorID, "index", index)
	reply.Tokens = []*structs.ACLToken{stored}
	reply.Index = index
	return nil
}

// UpsertPolicies writes policies; every one must parse, or none is written.
func (a *ACL) UpsertPolicies(args *structs.ACLPolicyUpsertRequest, reply *structs.GenericResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.UpsertPolicies", args, args, reply); done {
		return err
	}
	if len(args.Policies) == 0 || len(args.Policies) > structs.MaxACLObjectsPerWrite {
		return fmt.Errorf("%w: give 1 to %d policies", structs.ErrInvalidRequest, structs.MaxACLObjectsPerWrite)
	}
	out := make([]*structs.ACLPolicy, 0, len(args.Policies))
	for _, p := range args.Policies {
		if p == nil {
			return fmt.Errorf("%w: policies must not hold null", structs.ErrInvalidRequest)
		}
		if err := structs.ValidACLPolicyName(p.Name); err != nil {
			return err
		}
		if len(p.Description) > structs.MaxACLPolicyDescLen {
			return fmt.Errorf("%w: policy %q: description longer than %d characters", structs.ErrInvalidRequest, p.Name, structs.MaxACLPolicyDescLen)
		}
		if _, err := acl.Parse(p.Rules); err != nil {
			return fmt.Errorf("%w: policy %q: %w", structs.ErrInvalidRequest, p.Name, err)
		}
		out = append(out, &structs.ACLPolicy{Name: p.Name, Description: p.Description, Rules: p.Rules})
	}
	_, index, err := a.srv.raftApply(structs.ACLPolicyUpsertRequestType, &structs.ACLPolicyUpsertRequest{Policies: out})
	reply.Index = index
	return err
}

// DeletePolicies deletes policies by name.
func (a *ACL) DeletePolicies(args *structs.ACLPolicyDeleteRequest, reply *structs.GenericResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.DeletePolicies", args, args, reply); done {
		return err
	}
	if len(args.Names) == 0 || len(args.Names) > structs.MaxACLObjectsPerWrite {
		return fmt.Errorf("%w: give 1 to %d policy names", structs.ErrInvalidRequest, structs.MaxACLObjectsPerWrite)
	}
	for _, n := range args.Names {
		if err := structs.ValidACLPolicyName(n); err != nil {
			return err
		}
	}
	_, index, err := a.srv.raftApply(structs.ACLPolicyDeleteRequestType, &structs.ACLPolicyDeleteRequest{Names: args.Names})
	reply.Index = index
	return err
}

// ListPolicies lists policies without their rules.
func (a *ACL) ListPolicies(args *structs.GenericRequest, reply *structs.ACLPolicyListResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.ListPolicies", args, args, reply); done {
		return err
	}
	return a.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		ps, err := store.ACLPolicies(ws)
		if err != nil {
			return err
		}
		reply.Policies = make([]*structs.ACLPolicyListStub, 0, len(ps))
		for _, p := range ps {
			if args.Prefix == "" || strings.HasPrefix(p.Name, args.Prefix) {
				reply.Policies = append(reply.Policies, p.Stub())
			}
		}
		reply.Index, err = store.Index(state.TableACLPolicies)
		return err
	})
}

// GetPolicy reads one policy; a missing one answers a nil Policy.
func (a *ACL) GetPolicy(args *structs.ACLPolicySpecificRequest, reply *structs.ACLPolicyResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.GetPolicy", args, args, reply); done {
		return err
	}
	return a.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		p, err := store.ACLPolicyByName(ws, args.Name)
		if err != nil {
			return err
		}
		reply.Policy = p
		if p != nil {
			reply.Index = p.ModifyIndex
			return nil
		}
		reply.Index, err = store.Index(state.TableACLPolicies)
		return err
	})
}

// UpsertTokens creates tokens (no AccessorID: the server makes both IDs)
// and updates them (name and policies; the secret and type never change).
func (a *ACL) UpsertTokens(args *structs.ACLTokenUpsertRequest, reply *structs.ACLTokenUpsertResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.UpsertTokens", args, args, reply); done {
		return err
	}
	if len(args.Tokens) == 0 || len(args.Tokens) > structs.MaxACLObjectsPerWrite {
		return fmt.Errorf("%w: give 1 to %d tokens", structs.ErrInvalidRequest, structs.MaxACLObjectsPerWrite)
	}
	store := a.srv.State()
	out := make([]*structs.ACLToken, 0, len(args.Tokens))
	for _, t := range args.Tokens {
		if t == nil {
			return fmt.Errorf("%w: tokens must not hold null", structs.ErrInvalidRequest)
		}
		if err := t.Validate(); err != nil {
			return err
		}
		for _, name := range t.Policies {
			p, err := store.ACLPolicyByName(nil, name)
			if err != nil {
				return err
			}
			if p == nil {
				return fmt.Errorf("%w: cannot find policy %q", structs.ErrInvalidRequest, name)
			}
		}
		c := &structs.ACLToken{
			AccessorID: t.AccessorID, Name: t.Name, Type: t.Type,
			Policies: append([]string(nil), t.Policies...), Global: t.Global,
		}
		if c.AccessorID == "" {
			c.AccessorID, c.SecretID, c.CreateTime = uuid.NewString(), uuid.NewString(), time.Now().UTC()
		} else {
			old, err := store.ACLTokenByAccessorID(nil, c.AccessorID)
			if err != nil {
				return err
			}
			if old == nil {
				return fmt.Errorf("%w: acl token %q", structs.ErrNotFound, c.AccessorID)
			}
			if old.Type != c.Type {
				return fmt.Errorf("%w: cannot change the type of token %s", structs.ErrInvalidRequest, c.AccessorID)
			}
			c.SecretID, c.CreateTime = old.SecretID, old.CreateTime
		}
		out = append(out, c)
	}
	_, index, err := a.srv.raftApply(structs.ACLTokenUpsertRequestType, &structs.ACLTokenUpsertRequest{Tokens: out})
	if err != nil {
		return err
	}
	store = a.srv.State()
	for _, t := range out {
		stored, err := store.ACLTokenByAccessorID(nil, t.AccessorID)
		if err != nil {
			return err
		}
		if stored != nil {
			reply.Tokens = append(reply.Tokens, stored)
		}
	}
	reply.Index = index
	return nil
}

// DeleteTokens deletes tokens by accessor.
func (a *ACL) DeleteTokens(args *structs.ACLTokenDeleteRequest, reply *structs.GenericResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.DeleteTokens", args, args, reply); done {
		return err
	}
	if len(args.AccessorIDs) == 0 || len(args.AccessorIDs) > structs.MaxACLObjectsPerWrite {
		return fmt.Errorf("%w: give 1 to %d token accessors", structs.ErrInvalidRequest, structs.MaxACLObjectsPerWrite)
	}
	_, index, err := a.srv.raftApply(structs.ACLTokenDeleteRequestType, &structs.ACLTokenDeleteRequest{AccessorIDs: args.AccessorIDs})
	reply.Index = index
	return err
}

// ListTokens lists tokens: accessors, never secrets.
func (a *ACL) ListTokens(args *structs.GenericRequest, reply *structs.ACLTokenListResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.ListTokens", args, args, reply); done {
		return err
	}
	return a.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		ts, err := store.ACLTokens(ws)
		if err != nil {
			return err
		}
		reply.Tokens = make([]*structs.ACLTokenListStub, 0, len(ts))
		for _, t := range ts {
			if args.Prefix == "" || strings.HasPrefix(t.AccessorID, args.Prefix) {
				reply.Tokens = append(reply.Tokens, t.Stub())
			}
		}
		reply.Index, err = store.Index(state.TableACLTokens)
		return err
	})
}

// GetToken reads one token by accessor (management only, so the secret
// goes to a caller who could make its own).
func (a *ACL) GetToken(args *structs.ACLTokenSpecificRequest, reply *structs.ACLTokenResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	if done, err := a.srv.forward("ACL.GetToken", args, args, reply); done {
		return err
	}
	return a.srv.blockingRPC(&args.QueryOptions, &reply.QueryMeta, func(ws memdb.WatchSet, store *state.StateStore) error {
		t, err := store.ACLTokenByAccessorID(ws, args.AccessorID)
		if err != nil {
			return err
		}
		reply.Token = t
		if t != nil {
			reply.Index = t.ModifyIndex
			return nil
		}
		reply.Index, err = store.Index(state.TableACLTokens)
		return err
	})
}

// ResolveToken answers for the caller's own secret: its token (nil for
// the anonymous token) and its policies. Client agents use it to check
// HTTP routes; `roam acl token self` uses it.
func (a *ACL) ResolveToken(args *structs.GenericRequest, reply *structs.ResolveACLTokenResponse) error {
	if err := a.enabled(); err != nil {
		return err
	}
	args.AllowStale = true // any server's view will do: ACL tables replicate with Raft
	if done, err := a.srv.forward("ACL.ResolveToken", args, args, reply); done {
		return err
	}
	store := a.srv.State()
	var names []string
	if args.AuthToken == "" {
		names = []string{structs.AnonymousPolicyName}
	} else {
		t, err := store.ACLTokenBySecretID(nil, args.AuthToken)
		if err != nil {
			return err
		}
		if t == nil {
			return ErrTokenNotFound
		}
		reply.Token = t
		names = t.Policies
	}
	for _, n := range names {
		p, err := store.ACLPolicyByName(nil, n)
		if err != nil {
			return err
		}
		if p != nil {
			reply.Policies = append(reply.Policies, p)
		}
	}
	idx, err := aclTablesIndex(store)
	reply.Index = idx
	a.srv.setQueryMeta(&reply.QueryMeta)
	return err
}
