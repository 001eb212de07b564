package client

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/roamhq/roam/plugins/csi/hostpath"
	"github.com/roamhq/roam/structs"
)

// escapeLayout is a client data dir depth levels below a temp dir, with
// a sentinel directory beside it that holds a file. Every hostile ID a
// test uses reaches no higher than base, so even a run with the checks
// disabled touches nothing but the test's own temp dir.
//
//	base/d1/…/d<depth>/data     the client's data dir
//	base/d1/…/d<depth>/victim/  the sentinel, with keep.txt inside
type escapeLayout struct {
	base, dataDir, victim string
	// before lists base, but for the data dir, as it was set up.
	before []string
}

func newEscapeLayout(t *testing.T, depth int) *escapeLayout {
	t.Helper()
	base := t.TempDir()
	parent := base
	for i := 1; i <= depth; i++ {
		parent = filepath.Join(parent, fmt.Sprintf("d%d", i))
	}
	l := &escapeLayout{base: base, dataDir: filepath.Join(parent, "data"), victim: filepath.Join(parent, "victim")}
	must.NoError(t, os.MkdirAll(l.dataDir, 0o755))
	must.NoError(t, os.MkdirAll(l.victim, 0o755))
	must.NoError(t, os.WriteFile(filepath.Join(l.victim, "keep.txt"), []byte("keep"), 0o644))
	l.before = l.outside(t)
	return l
}

// outside lists every path beneath base, relative to it, but for the data
// dir and what it holds.
func (l *escapeLayout) outside(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(l.base, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == l.dataDir {
			return filepath.SkipDir
		}
		if rel, _ := filepath.Rel(l.base, path); rel != "." {
			out = append(out, rel)
		}
		return nil
	})
	must.NoError(t, err)
	slices.Sort(out)
	return out
}

// untouched checks that nothing but the data dir changed in base: the
// sentinel is still a directory holding its file, and no entry appeared
// or went.
func (l *escapeLayout) untouched(t *testing.T) {
	t.Helper()
	fi, err := os.Lstat(l.victim)
	must.NoError(t, err, must.Sprint("the sentinel directory outside the data dir is gone"))
	must.True(t, fi.IsDir(), must.Sprintf("the sentinel is now %s", fi.Mode()))
	b, err := os.ReadFile(filepath.Join(l.victim, "keep.txt"))
	must.NoError(t, err)
	must.Eq(t, "keep", string(b))
	must.Eq(t, l.before, l.outside(t), must.Sprint("something was created or removed outside the data dir"))
}

// listDir lists the names in dir.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	must.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// The volume: an ID of ten "../" and a directory name, already in
// the servers' state (say, registered before they checked IDs). The mount
// fails, naming the ID, before the plugin is asked anything; nothing is
// created outside the data dir; and the claim goes back.
func TestCSIVolumes_HostileVolumeIDStaysInDataDir(t *testing.T) {
	for _, tc := range []struct {
		name     string
		depth    int
		volID    string
		pluginID string
		allocID  string
	}{
		// From the target's parent (csi/hp/per-alloc/<alloc>), five ".."
		// reach the data dir's parent, where the sentinel is.
		{name: "volume ID", depth: 1, volID: "../../../../../victim", pluginID: "hp", allocID: "alloc-1"},
		// Ten reach 6 levels above the data dir from the target, 7 from
		// the staging path: the data dir is 9 deep, so it stays in base.
		{name: "ten dot-dots", depth: 9, volID: strings.Repeat("../", 10) + "victim", pluginID: "hp", allocID: "alloc-1"},
		{name: "NUL", depth: 1, volID: "vol\x00", pluginID: "hp", allocID: "alloc-1"},
		{name: "alloc ID", depth: 1, volID: "vol", pluginID: "hp", allocID: "../../../../victim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestVolumeSetup(t)
			l := newEscapeLayout(t, tc.depth)
			ext := createVolume(t, s.ep, "hp", "hostile")
			var released []string
			vols := newCSIVolumeManager(csiVolumeManagerConfig{
				DataDir: l.dataDir,
				Plugins: s.vols.cfg.Plugins,
				Claim: func(ctx context.Context, alloc *structs.Allocation, req *structs.VolumeRequest) (*CSIMountClaim, error) {
					var resp structs.ClientCSIControllerAttachVolumeResponse
					areq := attachRequest("hp", ext, "node-h")
					if err := s.ep.controllerAttachVolume(ctx, areq, &resp); err != nil {
						return nil, err
					}
					return &CSIMountClaim{
						Volume:         &structs.CSIVolume{ID: tc.volID, ExternalID: ext, PluginID: tc.pluginID},
						PublishContext: resp.PublishContext,
					}, nil
				},
				Release: func(_ context.Context, _ *structs.Allocation, volID string) error {
					released = append(released, volID)
					return nil
				},
				Logger: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
			})
			alloc := &structs.Allocation{ID: tc.allocID}
			_, err := vols.Mount(context.Background(), alloc, volumeRequest(ext))
			l.untouched(t)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			if tc.allocID != "alloc-1" {
				must.StrContains(t, err.Error(), structs.IDKindAlloc+" "+fmt.Sprintf("%q", tc.allocID))
			} else {
				must.StrContains(t, err.Error(), structs.IDKindVolume+" "+fmt.Sprintf("%q", tc.volID))
			}
			must.Eq(t, []string{tc.volID}, released, must.Sprint("the claim of the refused mount goes back"))
			log, err := hostpath.ReadCallLog(s.stateDir, "node-h")
			must.NoError(t, err)
			for _, r := range log {
				must.False(t, strings.HasPrefix(r.Method, "NodeStage") || strings.HasPrefix(r.Method, "NodePublish"),
					must.Sprintf("the plugin was asked to %s", r.Method))
			}
		})
	}
}

// The "existing directory deleted on unpublish": a server asks
// this client to detach a volume whose IDs lead the rebuilt target path
// onto an existing empty directory outside the data dir, which the plugin
// would remove as a leftover target. The client refuses, naming the ID,
// and the plugin is never asked.
func TestClientCSI_NodeDetachHostileIDs(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  func(ext string) *structs.ClientCSINodeDetachVolumeRequest
		want string
	}{
		{
			name: "volume ID",
			req: func(ext string) *structs.ClientCSINodeDetachVolumeRequest {
				return &structs.ClientCSINodeDetachVolumeRequest{PluginID: "hp", VolumeID: "../../../../../empty", ExternalID: ext, AllocID: "alloc-1"}
			},
			want: `volume ID "../../../../../empty"`,
		},
		{
			name: "alloc ID",
			req: func(ext string) *structs.ClientCSINodeDetachVolumeRequest {
				return &structs.ClientCSINodeDetachVolumeRequest{PluginID: "hp", VolumeID: "empty", ExternalID: ext, AllocID: "../../../../"}
			},
			want: `allocation ID "../../../../"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestVolumeSetup(t)
			l := newEscapeLayout(t, 1)
			// The plugin removes an empty directory found at a target path.
			empty := filepath.Join(l.base, "d1", "empty")
			must.NoError(t, os.Mkdir(empty, 0o755))
			ext := createVolume(t, s.ep, "hp", "detach-hostile")
			vols := newCSIVolumeManager(csiVolumeManagerConfig{
				DataDir: l.dataDir,
				Plugins: s.vols.cfg.Plugins,
				Logger:  hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
			})
			ep := &ClientCSI{mgr: s.vols.cfg.Plugins, vols: vols}
			var resp structs.ClientCSINodeDetachVolumeResponse
			err := ep.NodeDetachVolume(tc.req(ext), &resp)
			fi, serr := os.Stat(empty)
			must.NoError(t, serr, must.Sprint("an existing directory outside the data dir was deleted"))
			must.True(t, fi.IsDir())
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.StrContains(t, err.Error(), tc.want)
			log, err := hostpath.ReadCallLog(s.stateDir, "node-h")
			must.NoError(t, err)
			for _, r := range log {
				must.False(t, strings.HasPrefix(r.Method, "NodeUnpublish") || strings.HasPrefix(r.Method, "NodeUnstage"),
					must.Sprintf("the plugin was asked to %s", r.Method))
			}
		})
	}
}

// An allocation whose ID leads out of <DataDir>/alloc fails before any
// task starts, and its garbage collection removes nothing outside.
func TestAllocRunner_HostileAllocIDStaysInDataDir(t *testing.T) {
	l := newEscapeLayout(t, 1)
	db, err := openStateDB(t.TempDir())
	must.NoError(t, err)
	t.Cleanup(func() { _ = db.close() })

	alloc := testAlloc("node-1", structs.JobTypeBatch, noRestarts, shTask("web", "true"))
	// <DataDir>/alloc/../../victim is base/a/victim.
	alloc.ID = "../../victim"
	ar := newAllocRunner(allocRunnerConfig{
		alloc: alloc, dataDir: l.dataDir, db: db,
		logger: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
		report: func(*structs.Allocation, bool) {},
	})
	ar.destroyNow()
	l.untouched(t)
	must.ErrorIs(t, ar.setupErr, structs.ErrInvalidRequest)
	must.StrContains(t, ar.setupErr.Error(), `allocation ID "../../victim"`)
}

// A task name that leads out of the allocation directory fails the
// allocation; no path is built from it.
func TestAllocRunner_HostileTaskName(t *testing.T) {
	l := newEscapeLayout(t, 1)
	alloc := testAlloc("node-1", structs.JobTypeBatch, noRestarts, shTask("../../../victim", "true"))
	alloc.Job.TaskGroups[0].Tasks[0].CSIPluginConfig = &structs.TaskCSIPluginConfig{ID: "hp", Type: structs.CSIPluginTypeNode}
	ar := newAllocRunner(allocRunnerConfig{
		alloc: alloc, dataDir: l.dataDir,
		logger: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}),
		report: func(*structs.Allocation, bool) {},
	})
	must.ErrorIs(t, ar.setupErr, structs.ErrInvalidRequest)
	must.StrContains(t, ar.setupErr.Error(), `task name "../../../victim"`)
	must.Eq(t, taskDirs{}, ar.tasks[0].dirs)
	must.Eq(t, "", ar.tasks[0].csiSocket)
	l.untouched(t)
}

// A task owns its task directory and may put a link there that leads
// out. A volume_mount through that link must not create the volume's
// link, or its parents, outside.
func TestLinkInTaskDir_TaskLinkCannotLeadOut(t *testing.T) {
	l := newEscapeLayout(t, 1)
	taskDir := filepath.Join(l.dataDir, "alloc", "a1", "web")
	must.NoError(t, os.MkdirAll(filepath.Join(taskDir, "local"), 0o755))
	// The task's own link, to the sentinel outside.
	must.NoError(t, os.Symlink(l.victim, filepath.Join(taskDir, "local", "out")))
	src := filepath.Join(l.dataDir, "csi", "hp", "per-alloc", "a1", "vol")

	for _, dest := range []string{"local/out/srv/data", "local/out/data", "/local/out/x/../data"} {
		err := linkInTaskDir(taskDir, dest, src)
		must.Error(t, err, must.Sprintf("destination %q", dest))
	}
	must.Eq(t, []string{"keep.txt"}, listDir(t, l.victim), must.Sprint("a link or directory appeared outside"))

	// An ordinary destination still works, parents and all.
	must.NoError(t, linkInTaskDir(taskDir, "/srv/data", src))
	got, err := os.Readlink(filepath.Join(taskDir, "srv", "data"))
	must.NoError(t, err)
	must.Eq(t, src, got)
	// The task dir itself is no destination.
	must.ErrorIs(t, linkInTaskDir(taskDir, "/", src), structs.ErrInvalidRequest)
}

// A plugin task's mount_dir may be a link of the task's that leads out:
// clearing the old socket must not remove a file there.
func TestPrepareCSIPlugin_TaskLinkCannotLeadOut(t *testing.T) {
	l := newEscapeLayout(t, 1)
	taskDir := filepath.Join(l.dataDir, "alloc", "a1", "plugin")
	must.NoError(t, os.MkdirAll(taskDir, 0o755))
	// A file named like the socket, outside, and the task's link to it.
	must.NoError(t, os.WriteFile(filepath.Join(l.victim, csiSocketName), []byte("not yours"), 0o644))
	must.NoError(t, os.Symlink(l.victim, filepath.Join(taskDir, "csi")))

	task := &structs.Task{Name: "plugin", CSIPluginConfig: &structs.TaskCSIPluginConfig{ID: "hp", Type: "node", MountDir: "/csi"}}
	dirs := taskDirs{TaskDir: taskDir}
	sock, dir, err := csiPluginSocket("0123456789abcdef", task, dirs)
	must.NoError(t, err)
	tr := &taskRunner{task: task, dirs: dirs, csiSocket: sock, csiDir: dir}
	must.Error(t, tr.prepareCSIPlugin())
	b, err := os.ReadFile(filepath.Join(l.victim, csiSocketName))
	must.NoError(t, err, must.Sprint("a file outside the task dir was removed"))
	must.Eq(t, "not yours", string(b))

	// A mount_dir that leads out by name is refused outright.
	task.CSIPluginConfig.MountDir = "../../victim"
	_, _, err = csiPluginSocket("0123456789abcdef", task, dirs)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
}

// idPath joins only components that pass structs.ValidateID.
func TestIDPath(t *testing.T) {
	p, err := idPath("/d", idOf(structs.IDKindPlugin, "hp"), fixed("staging"), idOf(structs.IDKindVolume, "data[2]"))
	must.NoError(t, err)
	must.Eq(t, "/d/hp/staging/data[2]", p)
	for _, bad := range []string{"", ".", "..", "../x", "a/b", `a\b`, "a\x00"} {
		_, err := idPath("/d", idOf(structs.IDKindVolume, bad))
		must.ErrorIs(t, err, structs.ErrInvalidRequest, must.Sprintf("%q", bad))
	}
	_, err = relUnder("/d", "/d/../e")
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	none := filepath.Join(t.TempDir(), "none")
	must.NoError(t, removeAllIn(none, filepath.Join(none, "x")))
}
