package state

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
)

// Table names. Tables for jobs, allocs, evals and CSI objects join these as
// their issues land; each registers itself in schemaFactories.
const (
	TableIndex = "index"
	TableNodes = "nodes"
)

// IndexEntry is the last Raft index that touched a table.
type IndexEntry struct {
	Key   string
	Value uint64
}

// schemaFactories build the table schemas; order does not matter.
var schemaFactories = []func() *memdb.TableSchema{
	indexTableSchema,
	nodeTableSchema,
}

func stateSchema() *memdb.DBSchema {
	db := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, f := range schemaFactories {
		t := f()
		if _, dup := db.Tables[t.Name]; dup {
			panic(fmt.Sprintf("state: table %q defined twice", t.Name))
		}
		db.Tables[t.Name] = t
	}
	if err := db.Validate(); err != nil {
		panic(fmt.Sprintf("state: invalid schema: %v", err))
	}
	return db
}

func indexTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableIndex,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {
				Name:    "id",
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "Key"},
			},
		},
	}
}

func nodeTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableNodes,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {
				Name:    "id",
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "ID"},
			},
			"secret_id": {
				Name:    "secret_id",
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "SecretID"},
			},
		},
	}
}
