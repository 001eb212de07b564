package client

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	execdriver "github.com/roamhq/roam/client/driver/exec"
	"github.com/roamhq/roam/client/driver/rawexec"
	"github.com/roamhq/roam/structs"
)

// Task driver names, as jobs write them.
const (
	rawExecDriver = "raw_exec"
	execDriver    = "exec"
)

// taskDrivers are the drivers this client runs tasks with. Both start
// tasks under rawexec's executor, so either re-attaches to any task.
type taskDrivers struct {
	// raw runs raw_exec tasks, and re-attaches to every task; when
	// raw_exec is disabled it still re-attaches and stops.
	raw *rawexec.Driver
	// exec is nil when this host cannot isolate tasks, or the agent turned
	// exec off; execReason then says why.
	exec       *execdriver.Driver
	execReason string
}

func newTaskDrivers(config *Config, logger hclog.Logger) (*taskDrivers, error) {
	raw, err := rawexec.New(rawexec.Config{ExecutorPath: config.ExecutorPath, Logger: logger,
		Disabled: config.DisableRawExec, DefaultUser: config.RawExecDefaultUser})
	if err != nil {
		return nil, fmt.Errorf("client: raw_exec driver: %w", err)
	}
	d := &taskDrivers{raw: raw}
	if config.DisableExec {
		d.execReason = "disabled by the client's configuration"
		return d, nil
	}
	if ok, reason := execdriver.Fingerprint(); !ok {
		d.execReason = reason
		logger.Warn("the exec driver is not available on this host; exec tasks are placed elsewhere", "reason", reason)
		return d, nil
	}
	d.exec, err = execdriver.New(execdriver.Config{
		ExecutorPath: config.ExecutorPath,
		Logger:       logger,
		ChrootEnv:    config.ChrootEnv,
		PidsLimit:    config.ExecPidsLimit,
		UserDenylist: config.UserDenylist,
		CgroupParent: config.CgroupParent,
	})
	if err != nil {
		return nil, fmt.Errorf("client: exec driver: %w", err)
	}
	return d, nil
}

// infos are the drivers the node offers, in Nomad's DriverInfo shape; an
// undetected driver is listed with the reason, so that operators see why
// exec tasks go elsewhere.
func (d *taskDrivers) infos(disableRawExec bool, attrs map[string]string) map[string]*structs.DriverInfo {
	now := time.Now()
	out := map[string]*structs.DriverInfo{}
	if !disableRawExec {
		// raw_exec needs nothing but the executor, which is this binary.
		attrs["driver."+rawExecDriver] = "1"
		out[rawExecDriver] = &structs.DriverInfo{
			Attributes: map[string]string{"driver." + rawExecDriver: "1"},
			Detected:   true, Healthy: true, HealthDescription: "Healthy", UpdateTime: now,
		}
	}
	if d.exec != nil {
		attrs["driver."+execDriver] = "1"
		attrs["unique.cgroup.version"] = execdriver.CgroupVersion()
		out[execDriver] = &structs.DriverInfo{
			Attributes: map[string]string{"driver." + execDriver: "1", "driver.exec.cgroup.version": execdriver.CgroupVersion()},
			Detected:   true, Healthy: true, HealthDescription: "Healthy", UpdateTime: now,
		}
	} else {
		out[execDriver] = &structs.DriverInfo{HealthDescription: d.execReason, UpdateTime: now}
	}
	return out
}

// reattach re-attaches to a task a previous client started with driver.
// exec cleans up after a task whose executor is gone; when exec is not
// available now, raw_exec's supervision still re-attaches and stops it.
func (d *taskDrivers) reattach(driver string, st rawexec.HandleState) (*rawexec.Handle, error) {
	if driver == execDriver && d.exec != nil {
		return d.exec.Reattach(st)
	}
	return d.raw.Reattach(st)
}
