package jobspec

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/roamhq/roam/structs"
)

// checkConfigNumbers refuses a driver config holding a number that
// float64 cannot hold (1e400 decodes to +Inf). Such a job would be
// stored, but JSON has no infinity: every read of it over the HTTP API
// would fail, and `roam job run` could not send it. ParseHCL refuses
// these in ctyToGo, with the attribute's position.
func checkConfigNumbers(job *structs.Job) error {
	var errs []error
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case float64:
			if math.IsInf(v, 0) || math.IsNaN(v) {
				errs = append(errs, fmt.Errorf("%s: number is out of range", path))
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(path+"."+k, v[k])
			}
		}
	}
	for _, tg := range job.TaskGroups {
		for _, t := range tg.Tasks {
			walk(fmt.Sprintf("task %q config", t.Name), t.Config)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", structs.ErrInvalidRequest, errors.Join(errs...))
	}
	return nil
}
