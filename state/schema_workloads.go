package state

import (
	memdb "github.com/hashicorp/go-memdb"
)

// Tables for workloads.
const (
	TableJobs   = "jobs"
	TableAllocs = "allocs"
	TableEvals  = "evals"
)

func init() {
	schemaFactories = append(schemaFactories, jobTableSchema, allocTableSchema, evalTableSchema)
}

// nsID indexes objects by namespace and ID together.
func nsID(idField string) memdb.Indexer {
	return &memdb.CompoundIndex{Indexes: []memdb.Indexer{
		&memdb.StringFieldIndex{Field: "Namespace"},
		&memdb.StringFieldIndex{Field: idField},
	}}
}

func jobTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableJobs,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: nsID("ID")},
		},
	}
}

func allocTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableAllocs,
		Indexes: map[string]*memdb.IndexSchema{
			"id":   {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			"job":  {Name: "job", Indexer: nsID("JobID")},
			"node": {Name: "node", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "NodeID"}},
			"eval": {Name: "eval", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "EvalID"}},
		},
	}
}

func evalTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableEvals,
		Indexes: map[string]*memdb.IndexSchema{
			"id":  {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			"job": {Name: "job", Indexer: nsID("JobID")},
		},
	}
}
