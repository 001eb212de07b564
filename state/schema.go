package state

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/roamhq/roam/structs"
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
			// The leader reads a plugin's controller nodes on every
			// destructive call; this spares it a scan of every node.
			"csi_controller": {
				Name:         "csi_controller",
				AllowMissing: true,
				Indexer:      controllerPluginIndex{},
			},
			// The nodes that may serve a plugin's controller call, in the
			// order they are tried: the lane reads the first one per
			// destructive call without looking at any other node.
			"csi_controller_ready": {
				Name:         "csi_controller_ready",
				AllowMissing: true,
				Indexer:      readyControllerIndex{},
			},
			// The draining nodes: the leader's drainer reads them on
			// every pass, once a second, and must not walk every node to
			// find the few.
			"draining": {
				Name: "draining",
				Indexer: &memdb.ConditionalIndex{Conditional: func(raw any) (bool, error) {
					n, ok := raw.(*structs.Node)
					if !ok {
						return false, fmt.Errorf("state: draining index: %T is not a node", raw)
					}
					return n.DrainStrategy != nil, nil
				}},
			},
		},
	}
}

// controllerPluginIndex indexes a node under each CSI plugin it runs a
// controller instance of, healthy or not.
type controllerPluginIndex struct{}

func (controllerPluginIndex) FromObject(raw any) (bool, [][]byte, error) {
	n, ok := raw.(*structs.Node)
	if !ok {
		return false, nil, fmt.Errorf("state: csi_controller index: %T is not a node", raw)
	}
	if len(n.CSIControllerPlugins) == 0 {
		return false, nil, nil
	}
	vals := make([][]byte, 0, len(n.CSIControllerPlugins))
	for id := range n.CSIControllerPlugins {
		vals = append(vals, []byte(id+"\x00"))
	}
	return true, vals, nil
}

func (controllerPluginIndex) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("state: csi_controller index takes one plugin ID, got %d arguments", len(args))
	}
	id, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("state: csi_controller index: plugin ID is %T, not a string", args[0])
	}
	return []byte(id + "\x00"), nil
}

// readyControllerIndex indexes a ready node under each CSI plugin whose
// controller instance on it is healthy: the controller candidates of
// DESIGN.md ("Choosing a controller"). memdb appends the node ID to the
// value of a non-unique index, so a plugin's entries come sorted by node
// ID, lowest first.
type readyControllerIndex struct{}

func (readyControllerIndex) FromObject(raw any) (bool, [][]byte, error) {
	n, ok := raw.(*structs.Node)
	if !ok {
		return false, nil, fmt.Errorf("state: csi_controller_ready index: %T is not a node", raw)
	}
	if !n.Ready() {
		return false, nil, nil
	}
	var vals [][]byte
	for id, info := range n.CSIControllerPlugins {
		if info != nil && info.Healthy {
			vals = append(vals, []byte(id+"\x00"))
		}
	}
	return len(vals) > 0, vals, nil
}

func (readyControllerIndex) FromArgs(args ...any) ([]byte, error) {
	return controllerPluginIndex{}.FromArgs(args...)
}
