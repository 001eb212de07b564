//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// diskFullSize is the file system the leader's data dir is moved to: room
// for the log's current 64 MiB segment and little else, as in the issue.
const diskFullSize = "96m"

// diskFreedSize is that file system once space is freed: room for two
// more segments.
const diskFreedSize = "256m"

// fillJobMeta is the size of each filler job's metadata: jobs close to
// job_max_bytes fill the log's segment in some tens of writes.
const fillJobMeta = 900 << 10

// A full disk under the leader. Its data dir is moved to a 96 MiB tmpfs,
// the rest of that file system is filled, and large job registrations
// are sent to it under claim churn until its log's segment is full: the
// rotation to the next segment finds no room, the next append fails, and
// the server stops with an error that says so (the agent exits 1, as a
// supervisor expects). Leadership moves to the others, whose writes go
// on; no acknowledged write is lost. Space is freed and the server started
// again, as its supervisor would: it reopens its log from disk and
// catches up, and the churn checker's three counts are 0.
//
// With ROAM_TEST_DISABLE_RAFT_LOG_GUARD=1 (a roamfaults build) the full
// server does not stop: raft-wal answers every later append "segment is
// sealed", even once space is free, and the server falls behind for
// good, which this test catches.
func TestFaults_LeaderDiskFull(t *testing.T) {
	guardOff := os.Getenv(nomadEnvDisableRaftLogGuard) == "1"
	if guardOff {
		t.Logf("%s=1: the raft log guard is off; the full server must fail to stop or to catch up", nomadEnvDisableRaftLogGuard)
	}
	cc, ch := startFaultCluster(t, 500*time.Millisecond)
	seed := time.Now().UnixNano() % 1e6
	ch.start(seed)

	// Move the leader's data dir onto the small file system.
	vi := cc.leaderOn(t, func(victim *Agent) {
		moved := victim.DataDir + ".before"
		must.NoError(t, os.Rename(victim.DataDir, moved))
		must.NoError(t, os.MkdirAll(victim.DataDir, 0o700))
		out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+diskFullSize+",mode=0700", "tmpfs", victim.DataDir).CombinedOutput()
		must.NoError(t, err, must.Sprintf("mount: %s", out))
		t.Cleanup(func() {
			_, _, _ = victim.Stop(30 * time.Second)
			if out, err := exec.Command("umount", "-l", victim.DataDir).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", victim.DataDir, err, out)
			}
		})
		must.NoError(t, copyTree(moved, victim.DataDir))
		preallocateSegments(t, filepath.Join(victim.DataDir, "raft", "wal"))
	})
	victim := cc.Servers[vi]

	// Fill what is left of its file system.
	filler := filepath.Join(victim.DataDir, "filler")
	freeAfterFill := fillDisk(t, filler)
	t.Logf("%s leads with its data dir on a %s tmpfs, filled (%d bytes free)", victim.Name, diskFullSize, freeAfterFill)

	acked := cc.writeUntilLogFails(t, victim, fillJob)
	// It said so before its disk was full: the file system is below what
	// the log needs from the start.
	must.StrContains(t, victim.Log(), "the data dir is running out of space",
		must.Sprint("the full server never warned of its disk"))
	// Space is freed, room for the log's next segment as well (the filler
	// alone leaves less than one segment: the restart would stop again at
	// the next rotation).
	cc.mustStopThenCatchUp(t, ch, vi, acked, "disk full", func() {
		must.NoError(t, os.Remove(filler))
		out, err := exec.Command("mount", "-o", "remount,size="+diskFreedSize, victim.DataDir).CombinedOutput()
		must.NoError(t, err, must.Sprintf("remount: %s", out))
	})
}

// A disk that fails writes under the leader: its data dir is served
// through a FUSE passthrough (diskfaults_linux.go) that answers EIO to
// every write once switched on. The first append that fails stops the
// server with the reason; the others lead; with the fault off, the
// restarted server opens its log (nothing half-written makes it
// unreadable) and catches up; no acknowledged write is lost, and the
// churn checker's three counts are 0.
func TestFaults_LeaderDiskWriteError(t *testing.T) {
	cc, ch := startFaultCluster(t, 500*time.Millisecond)
	ch.start(time.Now().UnixNano() % 1e6)
	var faults *diskFaults
	vi := cc.leaderOn(t, func(victim *Agent) { faults = onDiskFaults(t, victim) })
	victim := cc.Servers[vi]
	faults.failWrites.Store(true)
	t.Logf("%s leads; every write to its data dir now fails with EIO", victim.Name)
	acked := cc.writeUntilLogFails(t, victim, smallJob)
	must.Positive(t, faults.failed.Load())
	cc.mustStopThenCatchUp(t, ch, vi, acked, "write error", func() { faults.failWrites.Store(false) })
}

// leaderOn stops the leader, lets prepare change its data dir (mount
// something there), starts it again and makes it the leader once more. It
// returns the server's index.
func (cc *csiCluster) leaderOn(t *testing.T, prepare func(victim *Agent)) int {
	t.Helper()
	vi := cc.Leader()
	victim := cc.Servers[vi]
	_, killed, err := victim.Stop(30 * time.Second)
	must.NoError(t, err)
	must.False(t, killed)
	prepare(victim)
	cc.RestartServer(vi)
	cc.waitRejoined(t, vi)
	WaitFor(t, leaderTimeout, func() error {
		leader, err := cc.LeaderNow()
		if err != nil {
			return err
		}
		if leader == vi {
			return nil
		}
		_, errOut, code := RunCLIAt(t, cc.Servers[leader].HTTPAddr(), "operator", "raft", "transfer-leadership",
			"-peer-address", victim.RPCAddr())
		return fmt.Errorf("leader is %s; transfer to %s exited %d: %s", cc.Servers[leader].Name, victim.Name, code, errOut)
	})
	return vi
}

// writeUntilLogFails registers jobs (job(id) is the body) with the leader
// victim until one is refused, and checks the refusal is the 503 that
// names the failed log write. It returns the jobs acknowledged.
func (cc *csiCluster) writeUntilLogFails(t *testing.T, victim *Agent, job func(id string) []byte) []string {
	t.Helper()
	cl := &http.Client{Timeout: 30 * time.Second}
	var acked []string
	var failed string
	for i := 0; i < 200 && failed == ""; i++ {
		id := fmt.Sprintf("fill-%03d", i)
		ans, err := sendHTTP(cl, http.MethodPut, victim.HTTPAddr()+"/v1/jobs", job(id))
		switch {
		case err != nil:
			failed = fmt.Sprintf("%s: %v", id, err)
		case ans.Status != http.StatusOK:
			failed = fmt.Sprintf("%s: %s", id, ans)
		default:
			acked = append(acked, id)
		}
	}
	t.Logf("%d jobs acknowledged by %s, then: %s", len(acked), victim.Name, failed)
	must.NotEq(t, "", failed, must.Sprint("200 writes and the leader never failed one"))
	must.StrContains(t, failed, "503", must.Sprint("the failed write's answer"))
	must.StrContains(t, failed, "could not write its raft log")
	return acked
}

// mustStopThenCatchUp checks what follows a failed log write on server
// vi: it exits 1 with the reason, the others lead and take writes; then
// fix clears the fault, the server is started again (as its supervisor
// would), catches up, and every acknowledged write (acked and those made
// meanwhile) reads back from every server; the churn checker ends it.
func (cc *csiCluster) mustStopThenCatchUp(t *testing.T, ch *claimChurn, vi int, acked []string, scenario string, fix func()) {
	t.Helper()
	victim := cc.Servers[vi]
	failedAt := time.Now()
	others := make([]*Agent, 0, len(cc.Servers)-1)
	for i, s := range cc.Servers {
		if i != vi {
			others = append(others, s)
		}
	}
	// The server stops with the reason, exit 1.
	code, err := victim.Wait(60 * time.Second)
	if err != nil {
		if rt, err := ReadRuntime(victim.HTTPAddr()); err == nil {
			t.Logf("%s still runs, applied index %d", victim.Name, rt.RaftApplied)
		}
	}
	must.NoError(t, err, must.Sprint("the server whose log failed a write must stop"))
	log := victim.Log()
	must.StrContains(t, log, "could not write its raft log")
	// On a disk that fails every write, the stepped-down server may stand
	// for election before it has stopped and fail to write its term:
	// that stops it the same way (raftlog.Stable), never with Raft's
	// panic.
	must.EqOp(t, 1, code, must.Sprintf("%s must exit 1 with the reason", victim.Name))
	must.StrNotContains(t, log, "panic:")
	if strings.Contains(log, "write raft's term") {
		t.Logf("%s could not write its term either, and stopped on that", victim.Name)
	}
	t.Logf("%s exited %d %s after its failed write", victim.Name, code, time.Since(failedAt).Round(time.Millisecond))

	// The others lead and take writes.
	newLeader := waitLeaderAmong(t, cc.Cluster, others)
	for i := range 5 {
		id := fmt.Sprintf("after-%d", i)
		must.NoError(t, SendJSON(http.MethodPut, others[0].HTTPAddr(), "/v1/jobs", json.RawMessage(smallJob(id)), nil))
		acked = append(acked, id)
	}
	t.Logf("%s leads; writes go on", newLeader)

	// The fault is cleared; the supervisor starts the server again.
	fix()
	restartAt := time.Now()
	cc.RestartServer(vi)
	leader := cc.waitRejoined(t, vi)
	WaitFor(t, csiSettle, func() error {
		want, err := ReadRuntime(cc.Servers[leader].HTTPAddr())
		if err != nil {
			return err
		}
		got, err := ReadRuntime(victim.HTTPAddr())
		if err != nil {
			return err
		}
		if got.RaftApplied < want.RaftApplied {
			return fmt.Errorf("%s applied %d, the leader %d", victim.Name, got.RaftApplied, want.RaftApplied)
		}
		return nil
	})
	t.Logf("%s caught up %s after its restart", victim.Name, time.Since(restartAt).Round(time.Millisecond))

	// No acknowledged write is lost, on any server.
	lost := 0
	for _, s := range cc.Servers {
		for _, id := range acked {
			var job struct{ ID string }
			if err := GetJSON(s.HTTPAddr(), "/v1/job/"+id+"?stale=true", &job); err != nil || job.ID != id {
				lost++
				t.Errorf("%s: acknowledged job %s: %v", s.Name, id, err)
			}
		}
	}
	t.Logf("%s: %d acknowledged writes read back from every server, %d lost", scenario, len(acked), lost)
	ch.waitCycled(scenario+": after the catch-up", 2)
	rep := ch.check(t, scenario, time.Now(), nil, nil, nil)
	t.Logf("%s counts: claims cycled=%d", scenario, rep.Cycles)
}

// preallocateSegments allocates the whole of each log segment file in dir,
// as raft-wal did where they were made (a copy leaves their unwritten part
// a hole): the full disk then fails the log at its next rotation, the way
// it fails a server whose disk fills while it runs.
func preallocateSegments(t *testing.T, dir string) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	must.NoError(t, err)
	must.SliceNotEmpty(t, segs)
	for _, seg := range segs {
		f, err := os.OpenFile(seg, os.O_RDWR, 0)
		must.NoError(t, err)
		fi, err := f.Stat()
		must.NoError(t, err)
		must.NoError(t, syscall.Fallocate(int(f.Fd()), 0, 0, fi.Size()))
		must.NoError(t, f.Close())
	}
}

// fillDisk writes path until its file system is full and returns the
// bytes left free (those a new file cannot take).
func fillDisk(t *testing.T, path string) uint64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	must.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		n, err := f.Write(chunk)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		must.NoError(t, err)
		if n < len(chunk) {
			break
		}
	}
	// The last partial page may still take a few bytes.
	for {
		if _, err := f.Write(chunk[:4096]); err != nil {
			must.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	var fs syscall.Statfs_t
	must.NoError(t, syscall.Statfs(path, &fs))
	return fs.Bavail * uint64(fs.Bsize)
}

// fillJob is a job with no allocations whose metadata makes it close to
// job_max_bytes: one large Raft entry.
func fillJob(id string) []byte { return countZeroJob(id, strings.Repeat("x", fillJobMeta)) }

// smallJob is a job with no allocations and little metadata.
func smallJob(id string) []byte { return countZeroJob(id, id) }

// countZeroJob is a job of one group of count 0, with meta "fill".
func countZeroJob(id, meta string) []byte {
	b, _ := json.Marshal(map[string]any{"Job": map[string]any{
		"ID": id, "Name": id, "Type": "service", "Datacenters": []string{"dc1"},
		"Meta": map[string]string{"fill": meta},
		"TaskGroups": []any{map[string]any{"Name": "g", "Count": 0, "Tasks": []any{map[string]any{
			"Name": "t", "Driver": "raw_exec", "Config": map[string]any{"command": "/bin/true"},
			"Resources": map[string]any{"CPU": 20, "MemoryMB": 16},
		}}}},
	}})
	return b
}
