package exec

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/roamhq/roam/client/driver/rawexec"
)

// BenchmarkTaskStart starts one exec task and one raw_exec task per
// iteration, alternately, each a shell that sleeps, and measures how long
// Start takes to return with the task running; it reports each driver's
// p50 and p99 and their ratio at p50, measured in the same run. It also
// reports the executor's resident memory with its task running.
func BenchmarkTaskStart(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("the exec driver needs root")
	}
	logger := hclog.NewNullLogger()
	ex, err := New(Config{ExecutorPath: os.Args[0], StartTimeout: 20 * time.Second, Logger: logger, CgroupParent: testCgroupParent})
	if err != nil {
		b.Fatal(err)
	}
	raw, err := rawexec.New(rawexec.Config{ExecutorPath: os.Args[0], StartTimeout: 20 * time.Second, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	var execTimes, rawTimes []time.Duration
	var execRSS, rawRSS []float64
	ctx := benchCtx(b)
	for i := 0; b.Loop(); i++ {
		base := b.TempDir()
		cfg := TaskConfig{
			ID: fmt.Sprintf("bench/%d", i), Command: "/bin/sh", Args: []string{"-c", "exec sleep 60"},
			Dir: filepath.Join(base, "task"), SharedDir: filepath.Join(base, "alloc"),
			StdoutPath: filepath.Join(base, "stdout"), StderrPath: filepath.Join(base, "stderr"),
			Resources: Resources{MemoryMB: 64, CPU: 100},
		}
		for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "local"), cfg.SharedDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		uid, gid, err := rawexec.LookupUser(DefaultUser)
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "local"), cfg.SharedDir} {
			if err := os.Chown(d, int(uid), int(gid)); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		h, err := ex.Start(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		execTimes = append(execTimes, time.Since(start))
		execRSS = append(execRSS, rssMiB(b, h.State().ExecutorPID))

		rawDir := filepath.Join(base, "raw")
		if err := os.MkdirAll(rawDir, 0o755); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		rh, err := raw.Start(ctx, rawexec.TaskConfig{
			ID: fmt.Sprintf("bench-raw/%d", i), Command: "/bin/sh", Args: []string{"-c", "exec sleep 60"},
			Dir: rawDir, StdoutPath: filepath.Join(base, "raw.stdout"), StderrPath: filepath.Join(base, "raw.stderr"),
		})
		if err != nil {
			b.Fatal(err)
		}
		rawTimes = append(rawTimes, time.Since(start))
		rawRSS = append(rawRSS, rssMiB(b, rh.State().ExecutorPID))

		b.StopTimer()
		for _, h := range []*rawexec.Handle{h, rh} {
			if err := h.Kill(ctx, "SIGKILL", time.Second); err != nil {
				b.Fatal(err)
			}
			if _, err := h.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	pe, pr := pct(execTimes, 50), pct(rawTimes, 50)
	b.ReportMetric(ms(pe), "exec-p50-ms")
	b.ReportMetric(ms(pct(execTimes, 99)), "exec-p99-ms")
	b.ReportMetric(ms(pr), "raw-p50-ms")
	b.ReportMetric(ms(pct(rawTimes, 99)), "raw-p99-ms")
	b.ReportMetric(float64(pe)/float64(pr), "exec/raw-p50")
	b.ReportMetric(slices.Max(execRSS), "exec-executor-max-RSS-MiB")
	b.ReportMetric(slices.Max(rawRSS), "raw-executor-max-RSS-MiB")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is the p-th percentile of ds, nearest rank.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// rssMiB is the resident memory of pid, from /proc.
func rssMiB(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return float64(kb) / 1024
		}
	}
	b.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	return ctx
}
