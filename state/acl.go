package state

import (
	"errors"
	"fmt"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/structs"
)

// ACL tables, and the index key that records the bootstrap.
const (
	TableACLPolicies = "acl_policies"
	TableACLTokens   = "acl_tokens"
	// IndexACLBootstrap holds the Raft index of the last bootstrap; a
	// reset names it to allow another.
	IndexACLBootstrap = "acl_token_bootstrap"
)

// ErrACLBootstrapDone is returned for a second bootstrap without the
// matching reset index.
var ErrACLBootstrapDone = errors.New("acl bootstrap already done")

func init() {
	schemaFactories = append(schemaFactories, aclPolicyTableSchema, aclTokenTableSchema)
}

func aclPolicyTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableACLPolicies,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Name"}},
		},
	}
}

func aclTokenTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableACLTokens,
		Indexes: map[string]*memdb.IndexSchema{
			"id":     {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "AccessorID"}},
			"secret": {Name: "secret", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "SecretID"}},
		},
	}
}

// UpsertACLPolicies writes policies at index.
func (s *StateStore) UpsertACLPolicies(index uint64, policies []*structs.ACLPolicy) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	for _, p := range policies {
		existing, err := txn.First(TableACLPolicies, "id", p.Name)
		if err != nil {
			return fmt.Errorf("state: acl policy lookup: %w", err)
		}
		c := *p
		c.CreateIndex, c.ModifyIndex = index, index
		if existing != nil {
			c.CreateIndex = existing.(*structs.ACLPolicy).CreateIndex
		}
		if err := txn.Insert(TableACLPolicies, &c); err != nil {
			return fmt.Errorf("state: acl policy insert: %w", err)
		}
	}
	if err := setIndexTxn(txn, TableACLPolicies, index); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// DeleteACLPolicies deletes policies by name; a missing one is an error
// and nothing is deleted.
func (s *StateStore) DeleteACLPolicies(index uint64, names []string) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	for _, n := range names {
		existing, err := txn.First(TableACLPolicies, "id", n)
		if err != nil {
			return fmt.Errorf("state: acl policy lookup: %w", err)
		}
		if existing == nil {
			return fmt.Errorf("%w: acl policy %q", structs.ErrNotFound, n)
		}
		if err := txn.Delete(TableACLPolicies, existing); err != nil {
			return fmt.Errorf("state: acl policy delete: %w", err)
		}
	}
	if err := setIndexTxn(txn, TableACLPolicies, index); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// ACLPolicyByName returns a policy or nil.
func (s *StateStore) ACLPolicyByName(ws memdb.WatchSet, name string) (*structs.ACLPolicy, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableACLPolicies, "id", name)
	if err != nil {
		return nil, fmt.Errorf("state: acl policy lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.ACLPolicy), nil
}

// ACLPolicies returns every policy, sorted by name.
func (s *StateStore) ACLPolicies(ws memdb.WatchSet) ([]*structs.ACLPolicy, error) {
	txn := s.db.Txn(false)
	it, err := txn.Get(TableACLPolicies, "id")
	if err != nil {
		return nil, fmt.Errorf("state: acl policies: %w", err)
	}
	ws.Add(it.WatchCh())
	var out []*structs.ACLPolicy
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*structs.ACLPolicy))
	}
	return out, nil
}

// UpsertACLTokens writes tokens at index.
func (s *StateStore) UpsertACLTokens(index uint64, tokens []*structs.ACLToken) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	if err := upsertACLTokensTxn(txn, index, tokens); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

func upsertACLTokensTxn(txn *memdb.Txn, index uint64, tokens []*structs.ACLToken) error {
	for _, t := range tokens {
		if t.AccessorID == "" || t.SecretID == "" {
			return fmt.Errorf("%w: acl token without accessor or secret", structs.ErrInvalidRequest)
		}
		existing, err := txn.First(TableACLTokens, "id", t.AccessorID)
		if err != nil {
			return fmt.Errorf("state: acl token lookup: %w", err)
		}
		c := t.Copy()
		c.CreateIndex, c.ModifyIndex = index, index
		if existing != nil {
			old := existing.(*structs.ACLToken)
			// The secret and type of a token never change.
			c.CreateIndex, c.SecretID, c.CreateTime = old.CreateIndex, old.SecretID, old.CreateTime
		}
		if err := txn.Insert(TableACLTokens, c); err != nil {
			return fmt.Errorf("state: acl token insert: %w", err)
		}
	}
	return setIndexTxn(txn, TableACLTokens, index)
}

// BootstrapACLToken stores the first management token, once: a second
// bootstrap succeeds only when resetIndex names the previous one.
func (s *StateStore) BootstrapACLToken(index, resetIndex uint64, token *structs.ACLToken) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	raw, err := txn.First(TableIndex, "id", IndexACLBootstrap)
	if err != nil {
		return fmt.Errorf("state: acl bootstrap lookup: %w", err)
	}
	if raw != nil {
		done := raw.(*IndexEntry).Value
		if resetIndex != done {
			return fmt.Errorf("%w (reset index: %d)", ErrACLBootstrapDone, done)
		}
	}
	if err := upsertACLTokensTxn(txn, index, []*structs.ACLToken{token}); err != nil {
		return err
	}
	if err := txn.Insert(TableIndex, &IndexEntry{Key: IndexACLBootstrap, Value: index}); err != nil {
		return fmt.Errorf("state: acl bootstrap index: %w", err)
	}
	txn.Commit()
	return nil
}

// DeleteACLTokens deletes tokens by accessor; a missing one is an error
// and nothing is deleted.
func (s *StateStore) DeleteACLTokens(index uint64, accessors []string) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	for _, a := range accessors {
		existing, err := txn.First(TableACLTokens, "id", a)
		if err != nil {
			return fmt.Errorf("state: acl token lookup: %w", err)
		}
		if existing == nil {
			return fmt.Errorf("%w: acl token %q", structs.ErrNotFound, a)
		}
		if err := txn.Delete(TableACLTokens, existing); err != nil {
			return fmt.Errorf("state: acl token delete: %w", err)
		}
	}
	if err := setIndexTxn(txn, TableACLTokens, index); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// ACLTokenByAccessorID returns a token or nil.
func (s *StateStore) ACLTokenByAccessorID(ws memdb.WatchSet, id string) (*structs.ACLToken, error) {
	return s.aclTokenBy(ws, "id", id)
}

// ACLTokenBySecretID returns a token or nil.
func (s *StateStore) ACLTokenBySecretID(ws memdb.WatchSet, secret string) (*structs.ACLToken, error) {
	return s.aclTokenBy(ws, "secret", secret)
}

func (s *StateStore) aclTokenBy(ws memdb.WatchSet, index, value string) (*structs.ACLToken, error) {
	txn := s.db.Txn(false)
	ch, raw, err := txn.FirstWatch(TableACLTokens, index, value)
	if err != nil {
		return nil, fmt.Errorf("state: acl token lookup: %w", err)
	}
	ws.Add(ch)
	if raw == nil {
		return nil, nil
	}
	return raw.(*structs.ACLToken), nil
}

// ACLTokens returns every token, sorted by accessor.
func (s *StateStore) ACLTokens(ws memdb.WatchSet) ([]*structs.ACLToken, error) {
	txn := s.db.Txn(false)
	it, err := txn.Get(TableACLTokens, "id")
	if err != nil {
		return nil, fmt.Errorf("state: acl tokens: %w", err)
	}
	ws.Add(it.WatchCh())
	var out []*structs.ACLToken
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*structs.ACLToken))
	}
	return out, nil
}

// ACLPolicy adds a policy to a restore.
func (r *Restore) ACLPolicy(p *structs.ACLPolicy) error {
	if err := r.txn.Insert(TableACLPolicies, p); err != nil {
		return fmt.Errorf("state: restore acl policy: %w", err)
	}
	return nil
}

// ACLToken adds a token to a restore.
func (r *Restore) ACLToken(t *structs.ACLToken) error {
	if err := r.txn.Insert(TableACLTokens, t); err != nil {
		return fmt.Errorf("state: restore acl token: %w", err)
	}
	return nil
}
