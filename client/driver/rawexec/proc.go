package rawexec

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// procStat is the part of /proc/<pid>/stat this package needs.
type procStat struct {
	State     byte
	PPID      int
	PGID      int
	SessionID int
	// StartTime is the process's start time in clock ticks since boot. With
	// the PID it names one process, even after the PID is reused.
	StartTime uint64
}

// readProcStat reads /proc/<pid>/stat.
func readProcStat(pid int) (procStat, error) {
	if pid <= 0 {
		return procStat{}, fmt.Errorf("invalid pid %d", pid)
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) is in parentheses and may itself contain
	// spaces or parentheses, so fields are counted from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field n is f[n-3]; starttime is field 22.
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var st procStat
	st.State = f[0][0]
	ints := []*int{&st.PPID, &st.PGID, &st.SessionID}
	for k, p := range ints {
		if *p, err = strconv.Atoi(f[1+k]); err != nil {
			return procStat{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
		}
	}
	if st.StartTime, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// processAlive reports whether pid is a live (not zombie) process and, when
// startTime is not zero, the same process that had that start time.
func processAlive(pid int, startTime uint64) bool {
	st, err := readProcStat(pid)
	if err != nil {
		return false
	}
	if st.State == 'Z' || st.State == 'X' || st.State == 'x' {
		return false
	}
	return startTime == 0 || st.StartTime == startTime
}

// groupExists reports whether any process is left in process group pgid.
func groupExists(pgid int) bool {
	if pgid <= 0 {
		return false
	}
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// signals maps the names TaskConfig.KillSignal accepts to signals.
var signals = map[string]syscall.Signal{
	"SIGHUP":  syscall.SIGHUP,
	"SIGINT":  syscall.SIGINT,
	"SIGQUIT": syscall.SIGQUIT,
	"SIGKILL": syscall.SIGKILL,
	"SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2,
	"SIGTERM": syscall.SIGTERM,
	"SIGALRM": syscall.SIGALRM,
	"SIGABRT": syscall.SIGABRT,
}

// parseSignal turns "SIGINT", "INT" or "sigint" into a signal; "" is def.
func parseSignal(name string, def syscall.Signal) (syscall.Signal, error) {
	if name == "" {
		return def, nil
	}
	n := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	sig, ok := signals[n]
	if !ok {
		return 0, fmt.Errorf("unknown signal %q", name)
	}
	return sig, nil
}

// writeFileAtomic writes v as JSON to path so that readers see either the
// old file (or none) or the whole new one, also across a crash.
func writeFileAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir of %s: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir of %s: %w", path, err)
	}
	return nil
}

// readJSONFile decodes path into v. A missing file gives an error for which
// errors.Is(err, fs.ErrNotExist) holds.
func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}
