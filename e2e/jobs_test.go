//go:build e2e

package e2e

import (
	"fmt"
	"strings"
)

// sleepScript runs until killed. exec makes the shell the sleep, so the
// task's PID is the process that runs.
const sleepScript = "exec sleep 3600"

// serviceJob is a service job of one group "g" with one raw_exec task "t"
// running script under /bin/sh. groupExtra is HCL added to the group
// (migrate, reschedule, restart blocks).
func serviceJob(id string, count int, groupExtra, script string) string {
	return fmt.Sprintf(`job %q {
  type        = "service"
  datacenters = ["dc1"]

  group "g" {
    count = %d
%s
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", %q]
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
`, id, count, indent(groupExtra, "    "), script)
}

// systemJob is a system job: one allocation of task "t" on every eligible
// node.
func systemJob(id string) string {
	return fmt.Sprintf(`job %q {
  type        = "system"
  datacenters = ["dc1"]

  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", %q]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
`, id, sleepScript)
}

func indent(s, prefix string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = prefix + strings.TrimSpace(l)
	}
	return strings.Join(lines, "\n") + "\n"
}

// migrateOne allows one migration of the group at a time.
const migrateOne = `migrate {
  max_parallel = 1
}`
