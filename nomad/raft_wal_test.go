package nomad

import (
	"testing"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/shoenig/test/must"
)

// A follower that had entries the new leader never saw clears that log
// suffix (raft's "clearing log suffix"). raft-wal v0.4.0 marked the tail
// segment sealed in its meta store on such a truncation without writing
// the segment's index block, so the next open of the log failed with
// "sealed segment has no index block" and raft.NewRaft panicked: a server
// that was cut off, rejoined and was then killed and restarted (the chaos
// run did exactly that) could never start again (hashicorp/raft-wal#31,
// fixed in v0.4.1).
func TestRaftWAL_ReopensAfterTailTruncation(t *testing.T) {
	dir := t.TempDir()
	open := func() (*raftwal.WAL, *metadb.BoltMetaDB) {
		meta := &metadb.BoltMetaDB{}
		w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta))
		must.NoError(t, err)
		return w, meta
	}
	w, meta := open()
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte("entry")})
	}
	must.NoError(t, w.StoreLogs(logs))
	// The suffix the new leader never had, then that leader's entry.
	must.NoError(t, w.DeleteRange(10, 10))
	must.NoError(t, w.StoreLogs([]*raft.Log{{Index: 10, Term: 2, Type: raft.LogCommand, Data: []byte("new")}}))
	must.NoError(t, w.Close())
	must.NoError(t, meta.Close())

	w, meta = open()
	t.Cleanup(func() {
		w.Close()
		meta.Close()
	})
	var got raft.Log
	must.NoError(t, w.GetLog(1, &got), must.Sprint("the log must read back after a restart"))
	must.NoError(t, w.GetLog(10, &got))
	must.Eq(t, uint64(2), got.Term)
}
