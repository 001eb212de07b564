//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/shoenig/test/must"
)

var kvBuild struct {
	once sync.Once
	path string
	err  error
}

// kvServerBinary builds testdata/kvserver, statically, once per run.
func kvServerBinary(t *testing.T) string {
	t.Helper()
	kvBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "roam-e2e-kv-")
		if err != nil {
			kvBuild.err = err
			return
		}
		kvBuild.path = filepath.Join(dir, "kvserver")
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		cmd := exec.Command(gobin, "build", "-o", kvBuild.path, "./testdata/kvserver")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			kvBuild.err = fmt.Errorf("go build kvserver: %w\n%s", err, out)
		}
	})
	if kvBuild.err != nil {
		t.Fatalf("e2e: %v", kvBuild.err)
	}
	return kvBuild.path
}

// kvJob is a service of one exec task, kvserver, on a port "http", with
// the single-node-writer volume source mounted at data/.
func kvJob(source string) string {
	return fmt.Sprintf(`job "kv" {
  type        = "service"
  datacenters = ["dc1"]

  group "g" {
    network {
      port "http" {}
    }
    volume "data" {
      type            = "csi"
      source          = %q
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    task "kv" {
      driver = "exec"
      config {
        command = "/opt/kvserver"
        args    = ["data"]
      }
      kill_timeout = "5s"
      volume_mount {
        volume      = "data"
        destination = "data"
      }
      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
`, source)
}

// allocAddr is where an allocation's port "http" listens.
func allocAddr(base, id string) (string, error) {
	var a struct {
		AllocatedResources *struct {
			Shared struct {
				Ports []struct {
					Label  string
					Value  int
					HostIP string
				}
			}
		}
	}
	if err := GetJSON(base, "/v1/allocation/"+id, &a); err != nil {
		return "", err
	}
	if a.AllocatedResources != nil {
		for _, p := range a.AllocatedResources.Shared.Ports {
			if p.Label == "http" {
				return net.JoinHostPort(p.HostIP, strconv.Itoa(p.Value)), nil
			}
		}
	}
	return "", fmt.Errorf("allocation %s has no port http", shortAlloc(id))
}

// publishedNodesOf is publishedNodes for a goroutine: nil when the plugin
// cannot be asked.
func publishedNodesOf(sock, ext string) []string {
	conn, err := dialPlugin(sock)
	if err != nil {
		return nil
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(conn).ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		return nil
	}
	for _, e := range resp.GetEntries() {
		if e.GetVolume().GetVolumeId() == ext {
			return e.GetStatus().GetPublishedNodeIds()
		}
	}
	return nil
}

// A stateful service under exec, on a single-node-writer volume, moves
// with a node drain and rides out a restart of its agent: every write it
// acknowledged is in the log it serves at the end, and the volume is
// never published to two nodes at once.
func TestExec_StatefulServiceSurvivesDrainAndRestart(t *testing.T) {
	kv := kvServerBinary(t)
	chroot := "client {\n  chroot_env = {\n"
	for _, d := range []string{"/bin", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr"} {
		chroot += fmt.Sprintf("    %q = %q\n", d, d)
	}
	chroot += fmt.Sprintf("    %q = \"/opt/kvserver\"\n  }\n}\n", kv)
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2, ClientConfigExtra: chroot})
	ext := cc.createVolumes(t, "client-0", "kvdata")
	cc.registerVolumeHTTP(t, "kvdata", ext[0])

	// Sample where the provider has the volume published, all along.
	var maxPublished atomic.Int32
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	sock := cc.Sockets["client-0"]
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			if n := int32(len(publishedNodesOf(sock, ext[0]))); n > maxPublished.Load() {
				maxPublished.Store(n)
			}
		}
	}()

	cc.RunJob(kvJob("kvdata"))
	first := cc.waitCSIAllocs(t, "kv", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "kvdata", first.ID)

	// The writer: one key at a time to wherever the service runs now;
	// a key counts once the service answered 200.
	var (
		mu    sync.Mutex
		acked []string
		addr  string
	)
	current := func() string {
		mu.Lock()
		defer mu.Unlock()
		return addr
	}
	locate := func() {
		list, err := JobAllocs(cc.API(), "kv")
		if err != nil {
			return
		}
		if r := running(list); len(r) == 1 {
			if a, err := allocAddr(cc.API(), r[0].ID); err == nil {
				mu.Lock()
				addr = a
				mu.Unlock()
			}
		}
	}
	locate()
	stopWriting := make(chan struct{})
	written := make(chan struct{})
	hc := &http.Client{Timeout: 2 * time.Second}
	go func() {
		defer close(written)
		for i := 1; ; i++ {
			key := fmt.Sprintf("k-%05d", i)
			for {
				select {
				case <-stopWriting:
					return
				default:
				}
				res, err := hc.Post("http://"+current()+"/write?key="+key, "text/plain", nil)
				if err == nil {
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode == http.StatusOK {
						mu.Lock()
						acked = append(acked, key)
						mu.Unlock()
						break
					}
				}
				locate()
				// Back off between retries against a moving service.
				select {
				case <-stopWriting:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	}()
	ackedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitAcked := func(n int) {
		t.Helper()
		WaitFor(t, csiSettle, func() error {
			if c := ackedCount(); c < n {
				return fmt.Errorf("%d writes acknowledged, want %d", c, n)
			}
			return nil
		})
	}
	waitAcked(20)

	// Drain the node: the service moves, its volume with it.
	drain(cc.Cluster, first.NodeID, "-deadline", "60s")
	var moved *Alloc
	WaitFor(t, csiSettle, func() error {
		list, err := JobAllocs(cc.API(), "kv")
		if err != nil {
			return err
		}
		r := running(list)
		if len(r) != 1 || r[0].ID == first.ID {
			return fmt.Errorf("want one running replacement:\n%s", allocTable(list))
		}
		moved = r[0]
		return nil
	})
	must.NotEq(t, first.NodeID, moved.NodeID)
	waitDrained(t, cc.Cluster, first.NodeID, drainSettle)
	base := ackedCount()
	waitAcked(base + 20)

	// Restart the agent under it: the task is re-attached, not restarted.
	idx := cc.clientIndex(cc.clientName(moved.NodeID))
	must.NonNegative(t, idx)
	cc.KillClient(idx, syscall.SIGTERM)
	cc.RestartClient(idx)
	WaitFor(t, csiSettle, func() error {
		n, err := NodeInfo(cc.API(), moved.NodeID)
		if err != nil {
			return err
		}
		if n.Status != "ready" {
			return fmt.Errorf("node %s is %s", n.Name, n.Status)
		}
		return nil
	})
	base = ackedCount()
	waitAcked(base + 20)
	close(stopWriting)
	<-written

	list, err := JobAllocs(cc.API(), "kv")
	must.NoError(t, err)
	r := running(list)
	must.SliceLen(t, 1, r, must.Sprintf("allocations:\n%s", allocTable(list)))
	must.Eq(t, moved.ID, r[0].ID, must.Sprint("the restart replaced the allocation"))
	must.Eq(t, uint64(0), r[0].TaskStates["kv"].Restarts, must.Sprint("the task was restarted, not re-attached"))

	res, err := hc.Get("http://" + current() + "/keys")
	must.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	must.NoError(t, err)
	have := map[string]bool{}
	for _, k := range strings.Fields(string(body)) {
		have[k] = true
	}
	mu.Lock()
	var lost []string
	for _, k := range acked {
		if !have[k] {
			lost = append(lost, k)
		}
	}
	n := len(acked)
	mu.Unlock()
	must.SliceEmpty(t, lost, must.Sprintf("acknowledged writes missing from the log"))

	close(stopSampling)
	<-sampled
	t.Logf("%d writes acknowledged across a drain and an agent restart, all in the log; the volume was published to at most %d node(s) at once", n, maxPublished.Load())
	must.Eq(t, int32(1), maxPublished.Load())
	cc.mustNoOverlaps(t)
}
