package jobspec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/roamhq/roam/structs"
)

// The json* types take the fields that survived the walk over
// jobFields, named as in Nomad's API. Pointers tell an absent field from
// a zero one.

type jsonJob struct {
	Region      string
	Namespace   string
	ID          string
	Name        string
	Type        string
	Priority    int
	AllAtOnce   bool
	Stop        bool
	Datacenters []string
	TaskGroups  []*jsonGroup
	Meta        map[string]string
}

type jsonGroup struct {
	Name             string
	Count            *int
	Tasks            []*jsonTask
	RestartPolicy    *restartSpec
	ReschedulePolicy *rescheduleSpec
	Migrate          *migrateSpec
	Volumes          map[string]*structs.VolumeRequest
	Networks         []*structs.NetworkResource
	Meta             map[string]string
}

type jsonTask struct {
	Name            string
	Driver          string
	Config          map[string]any
	Env             map[string]string
	Resources       *resourcesSpec
	KillTimeout     *time.Duration // nanoseconds
	KillSignal      string
	User            string
	VolumeMounts    []*structs.VolumeMount
	Meta            map[string]string
	CSIPluginConfig *structs.TaskCSIPluginConfig
	Lifecycle       *structs.TaskLifecycleConfig
	Templates       []*structs.Template
	Artifacts       []*structs.TaskArtifact
}

// ParseJSON parses a job in the JSON shape of Nomad's HTTP API, either
// wrapped as {"Job": {...}} or bare, defaults it and validates it.
// Durations are integer nanoseconds. A field Roam does not read is an
// error naming its path (Job.TaskGroups[0].Services is not supported)
// unless it holds its zero value or the value Nomad's Go client sends
// when the caller set nothing.
func ParseJSON(src []byte) (*structs.Job, error) {
	return ParseJSONWithLimits(src, structs.DefaultJobLimits())
}

// ParseJSONWithLimits is ParseJSON under l: a body larger than l.MaxBytes,
// nested deeper than l.MaxDepth, or listing more groups or tasks than l
// allows is refused before it is decoded, and the job must be within l's
// count limits.
func ParseJSONWithLimits(src []byte, l structs.JobLimits) (*structs.Job, error) {
	if err := CheckJSON(src, l); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("%w: decoding job JSON: %w", structs.ErrInvalidRequest, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalid("decoding job JSON: data after the job object")
	}
	if top == nil {
		return nil, invalid("decoding job JSON: no job")
	}

	w := &walker{probs: structs.Problems{Max: l.ErrorMaxProblems}}
	raw := top
	if inner, ok := top["Job"]; ok {
		raw, ok = inner.(map[string]any)
		if !ok {
			return nil, invalid("decoding job JSON: Job is not an object")
		}
		for _, k := range sortedKeys(top) {
			if k != "Job" && !isZero(top[k]) {
				w.unsupported(k)
			}
		}
	}
	clean := w.object("Job", raw, jobFields)
	w.checkTaskRestart("Job", clean)
	if err := w.probs.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", structs.ErrInvalidRequest, err)
	}

	buf, err := json.Marshal(clean)
	if err != nil {
		return nil, fmt.Errorf("%w: re-encoding job JSON: %w", structs.ErrInvalidRequest, err)
	}
	var jj jsonJob
	dec = json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber()
	if err := dec.Decode(&jj); err != nil {
		return nil, fmt.Errorf("%w: decoding job JSON: %w", structs.ErrInvalidRequest, err)
	}
	job := jj.job()
	if err := checkConfigNumbers(job); err != nil {
		return nil, err
	}
	return finish(job, l)
}

func (jj *jsonJob) job() *structs.Job {
	job := &structs.Job{
		Region:      jj.Region,
		Namespace:   jj.Namespace,
		ID:          jj.ID,
		Name:        jj.Name,
		Type:        jj.Type,
		Priority:    jj.Priority,
		AllAtOnce:   jj.AllAtOnce,
		Stop:        jj.Stop,
		Datacenters: jj.Datacenters,
		Meta:        jj.Meta,
	}
	for _, g := range jj.TaskGroups {
		if g == nil {
			continue
		}
		tg := &structs.TaskGroup{
			Name:             g.Name,
			Count:            1,
			RestartPolicy:    g.RestartPolicy.build(job.Type),
			ReschedulePolicy: g.ReschedulePolicy.build(job.Type),
			Migrate:          g.Migrate.build(),
			Volumes:          g.Volumes,
			Networks:         g.Networks,
			Meta:             g.Meta,
		}
		set(&tg.Count, g.Count)
		for name, v := range tg.Volumes {
			if v == nil {
				tg.Volumes[name] = &structs.VolumeRequest{}
			}
		}
		for _, t := range g.Tasks {
			if t == nil {
				continue
			}
			task := &structs.Task{
				Name:       t.Name,
				Driver:     t.Driver,
				Config:     plainConfig(t.Config),
				Env:        t.Env,
				Resources:  t.Resources.build(),
				KillSignal: t.KillSignal,
				User:       t.User,
				Meta:       t.Meta,

				CSIPluginConfig: t.CSIPluginConfig,
				Lifecycle:       t.Lifecycle,
			}
			for _, tp := range t.Templates {
				if tp != nil {
					task.Templates = append(task.Templates, tp)
				}
			}
			for _, a := range t.Artifacts {
				if a != nil {
					task.Artifacts = append(task.Artifacts, a)
				}
			}
			for _, vm := range t.VolumeMounts {
				if vm != nil {
					task.VolumeMounts = append(task.VolumeMounts, vm)
				}
			}
			if lc := task.Lifecycle; lc != nil && *lc == (structs.TaskLifecycleConfig{}) {
				// Nomad's client may send an empty block for none.
				task.Lifecycle = nil
			}
			set(&task.KillTimeout, t.KillTimeout)
			tg.Tasks = append(tg.Tasks, task)
		}
		job.TaskGroups = append(job.TaskGroups, tg)
	}
	return job
}

// plainConfig turns json.Numbers in a driver config into int64 when
// whole and float64 otherwise, as ParseHCL does.
func plainConfig(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out, _ := plain(m).(map[string]any)
	return out
}

func plain(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = plain(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = plain(e)
		}
		return out
	}
	return v
}
