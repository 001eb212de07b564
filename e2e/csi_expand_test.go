//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// createVolumeSpec is a `roam volume create` file for a single-node-writer
// file-system volume of the hostpath plugin with the given capacity_min.
func createVolumeSpec(id, capacityMin, extra string) string {
	return fmt.Sprintf(`id        = %q
type      = "csi"
plugin_id = %q
capacity_min = %q
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
%s
`, id, csiPluginID, capacityMin, extra)
}

// createVolumeCLI creates a volume from spec with `roam volume create` and
// returns its external ID.
func (cc *csiCluster) createVolumeCLI(t *testing.T, id, spec string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), id+".hcl")
	must.NoError(t, os.WriteFile(path, []byte(spec), 0o644))
	cc.MustCLI("volume", "create", path)
	v, err := cc.volume(id)
	must.NoError(t, err)
	must.NotEq(t, "", v.ExternalID)
	return v.ExternalID
}

// fsSize reads the hostpath plugin's file system size of the volume with
// external ID ext, as a task inside it sees it.
func (cc *csiCluster) fsSize(ext string) (int64, error) {
	b, err := os.ReadFile(cc.volumeFile(ext, ".roam-fs-size"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// TestCSI_ExpandRunningWriter expands the volume of a running writer: the
// task, which writes a 3 MiB file only once its file system holds it,
// writes it after `roam volume expand`, without a restart. A shrink is
// refused, and a create of the ID again with a larger capacity_min grows
// it too (Nomad's rule).
func TestCSI_ExpandRunningWriter(t *testing.T) {
	cc := startCSICluster(t, csiOpts{Servers: 1, Clients: 2})
	const mib = 1 << 20
	ext := cc.createVolumeCLI(t, "grow", createVolumeSpec("grow", "1MiB", ""))

	// The writer records each start, then waits until its file system is
	// large enough for the 3 MiB file it writes.
	script := `D="$ROAM_TASK_DIR/data"
echo "start $$" >> "$D/starts"
need=3145728
while :; do
  size=$(cat "$D/.roam-fs-size" 2>/dev/null || echo 0)
  if [ ! -f "$D/big" ] && [ "$size" -ge "$need" ]; then
    head -c "$need" /dev/zero > "$D/big.tmp" && mv "$D/big.tmp" "$D/big" && echo "wrote big with the file system at $size"
  fi
  sleep 0.1
done`
	cc.RunJob(csiJob("grower", "service", 1, "grow", false, "", script))
	alloc := cc.waitCSIAllocs(t, "grower", csiSettle, oneAlloc("running"))[0]
	cc.waitClaim(t, "grow", alloc.ID)
	WaitFor(t, csiSettle, func() error {
		if _, err := os.Stat(cc.volumeFile(ext, "starts")); err != nil {
			return fmt.Errorf("the task has not started: %w", err)
		}
		return nil
	})
	size, err := cc.fsSize(ext)
	must.NoError(t, err)
	must.Eq(t, int64(mib), size, must.Sprint("staging records the file system's size"))
	_, err = os.Stat(cc.volumeFile(ext, "big"))
	must.ErrorIs(t, err, os.ErrNotExist, must.Sprint("the 3 MiB file does not fit in 1 MiB"))

	// A shrink is refused by name and changes nothing.
	out, errOut, code := cc.RunCLI("volume", "expand", "grow", "512KiB")
	must.NotEq(t, 0, code, must.Sprintf("stdout: %s", out))
	must.StrContains(t, errOut, "cannot shrink")
	must.Eq(t, int64(0), cc.totalCalls(t, "ControllerExpandVolume"))

	out = cc.MustCLI("volume", "expand", "grow", "4MiB")
	must.StrContains(t, out, `Volume "grow" expanded to 4194304 bytes`)
	v, err := cc.volume("grow")
	must.NoError(t, err)
	must.Eq(t, int64(4*mib), v.Capacity)
	size, err = cc.fsSize(ext)
	must.NoError(t, err)
	must.Eq(t, int64(4*mib), size, must.Sprint("the node grew the mounted file system before the expand returned"))

	WaitFor(t, csiSettle, func() error {
		fi, err := os.Stat(cc.volumeFile(ext, "big"))
		if err != nil {
			return fmt.Errorf("the task has not written its file: %w", err)
		}
		if fi.Size() != 3*mib {
			return fmt.Errorf("big is %d bytes", fi.Size())
		}
		return nil
	})
	starts, err := os.ReadFile(cc.volumeFile(ext, "starts"))
	must.NoError(t, err)
	must.Eq(t, 1, strings.Count(string(starts), "start "), must.Sprintf("the task restarted: %q", starts))
	now := cc.waitCSIAllocs(t, "grower", csiSettle, oneAlloc("running"))[0]
	must.Eq(t, alloc.ID, now.ID)

	// Creating the ID again with a larger capacity_min expands it too.
	path := filepath.Join(t.TempDir(), "grow6.hcl")
	must.NoError(t, os.WriteFile(path, []byte(createVolumeSpec("grow", "6MiB", "")), 0o644))
	cc.MustCLI("volume", "create", path)
	size, err = cc.fsSize(ext)
	must.NoError(t, err)
	must.Eq(t, int64(6*mib), size)
	v, err = cc.volume("grow")
	must.NoError(t, err)
	must.Eq(t, int64(6*mib), v.Capacity)
	must.Eq(t, int64(2), cc.totalCalls(t, "ControllerExpandVolume"))

	cc.mustNoOverlaps(t)
}
