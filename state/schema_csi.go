package state

import memdb "github.com/hashicorp/go-memdb"

// Tables for CSI.
const (
	TableCSIVolumes = "csi_volumes"
	TableCSIPlugins = "csi_plugins"
)

func init() {
	schemaFactories = append(schemaFactories, csiVolumeTableSchema, csiPluginTableSchema)
}

func csiVolumeTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableCSIVolumes,
		Indexes: map[string]*memdb.IndexSchema{
			"id":     {Name: "id", Unique: true, Indexer: nsID("ID")},
			"plugin": {Name: "plugin", Indexer: &memdb.StringFieldIndex{Field: "PluginID"}},
		},
	}
}

func csiPluginTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableCSIPlugins,
		Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
		},
	}
}
