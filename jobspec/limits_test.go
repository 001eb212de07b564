package jobspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/roamhq/roam/structs"
	"github.com/shoenig/test/must"
)

// smallStack makes a check that fails (a parser recursing without bound)
// crash the test binary at 64 MB of stack rather than at 1 GB.
func smallStack(t *testing.T) {
	old := debug.SetMaxStack(64 << 20)
	t.Cleanup(func() { debug.SetMaxStack(old) })
}

// configJob is a job file whose raw_exec config has args = expr.
func configJob(expr string) string {
	return `job "deep" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
        args    = ` + expr + `
      }
    }
  }
}
`
}

// Each of these once overflowed the goroutine stack of the HCL parser or
// evaluator: "fatal error: stack overflow", the agent gone. Each is now
// refused before the parser runs, naming the limit and the line.
func TestParseHCL_DeepNestingRefused(t *testing.T) {
	smallStack(t)
	const n = 100_000
	cases := map[string]string{
		"brackets":       strings.Repeat("[", n) + strings.Repeat("]", n),
		"objects":        strings.Repeat("{a = ", n) + "1" + strings.Repeat("}", n),
		"parentheses":    strings.Repeat("(", n) + "1" + strings.Repeat(")", n),
		"negations":      strings.Repeat("-", 3*n) + "1",
		"nots":           strings.Repeat("!", 3*n) + "true",
		"binary chain":   "1" + strings.Repeat(" + 1", n),
		"ternary chain":  strings.Repeat("true ? 1 : ", n/2) + "2",
		"templates":      strings.Repeat(`"${`, n) + "1" + strings.Repeat(`}"`, n),
		"directives":     `"` + strings.Repeat("%{ if true }", n/4) + strings.Repeat("%{ endif }", n/4) + `"`,
		"calls":          strings.Repeat("max(", n) + "1" + strings.Repeat(")", n),
		"index chain":    "[1]" + strings.Repeat("[0]", n),
		"for expression": "{for k, v in {} :\n k => " + strings.Repeat("-\n", n) + "1}",
		"heredoc interp": "<<EOT\n" + strings.Repeat("${[", n) + strings.Repeat("]}", n) + "\nEOT\n",
	}
	for name, expr := range cases {
		t.Run(name, func(t *testing.T) {
			src := configJob(expr)
			job, err := ParseHCL("deep.hcl", []byte(src))
			must.Nil(t, job)
			must.ErrorIs(t, err, structs.ErrInvalidRequest)
			must.RegexMatch(t, regexp.MustCompile(`^invalid request: deep\.hcl:\d+: nesting is deeper than job_max_depth = 64$`), err.Error())
		})
	}
}

// The depth limit is the limit: a file exactly at it parses, one level
// more does not.
func TestParseHCL_DepthAtLimit(t *testing.T) {
	l := structs.DefaultJobLimits()
	// job, group, task and config are four levels; the list holds
	// MaxDepth-4 more.
	inner := l.MaxDepth - 4
	ok := configJob(strings.Repeat("[", inner) + "1" + strings.Repeat("]", inner))
	_, err := ParseHCLWithLimits("ok.hcl", []byte(ok), l)
	// The args are not strings, so validation fails, but after parsing.
	must.ErrorContains(t, err, "args[0] must be a string, got a list")

	deeper := configJob(strings.Repeat("[", inner+1) + "1" + strings.Repeat("]", inner+1))
	_, err = ParseHCLWithLimits("deep.hcl", []byte(deeper), l)
	must.ErrorContains(t, err, "nesting is deeper than job_max_depth = 64")
}

// What only looks deep is not: brackets in strings, heredocs and
// comments, escaped template sequences, and many operators separated by
// commas or newlines.
func TestParseHCL_ShallowAccepted(t *testing.T) {
	brackets := strings.Repeat("[{(", 100)
	// A hundred lines of operators, each line its own expression.
	var ops string
	for i := 0; i < 100; i++ {
		ops += fmt.Sprintf("    x%d = \"${-1 + 2 - 3 * 4}\"\n", i)
	}
	src := `job "shallow" {
  # ` + brackets + `
  // ` + brackets + `
  /* ` + brackets + ` */
  meta {
    a = "` + brackets + `"
    b = "$${` + brackets + `"
    c = "%%{` + brackets + `"
    d = "\"` + brackets + `"
    e = <<-EOT
      ` + brackets + `
      $${ ` + brackets + `
      EOT
` + ops + `
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
        args    = [` + strings.Repeat(`"-x", `, 200) + `"v${1}"]
      }
    }
  }
}
`
	job, err := ParseHCL("shallow.hcl", []byte(src))
	must.NoError(t, err)
	must.Eq(t, brackets, job.Meta["a"])
	must.Eq(t, "${"+brackets, job.Meta["b"])
	must.Eq(t, brackets+"\n${ "+brackets+"\n", job.Meta["e"])
	must.Len(t, 201, job.TaskGroups[0].Tasks[0].Config["args"].([]any))
	must.Eq(t, "-11", job.Meta["x99"])
}

func TestParseHCL_Unbalanced(t *testing.T) {
	for _, expr := range []string{`[1}`, `(1]`, `"${ [ }"`, `1)`} {
		_, err := ParseHCL("bad.hcl", []byte(configJob(expr)))
		must.ErrorIs(t, err, structs.ErrInvalidRequest)
		must.StrContains(t, err.Error(), "bad.hcl:7")
	}
	_, err := ParseHCL("bad.hcl", []byte(configJob("\"a\xffb\"")))
	must.ErrorContains(t, err, "bad.hcl: the file is not valid UTF-8")
	_, err = ParseHCL("bad.hcl", []byte(configJob("<<EOTé\nx\nEOTé\n")))
	must.ErrorContains(t, err, "a heredoc marker must be ASCII")
}

func TestParseHCL_SizeRefused(t *testing.T) {
	l := structs.DefaultJobLimits()
	l.MaxBytes = 1000
	src := configJob(`"` + strings.Repeat("x", 1000) + `"`)
	_, err := ParseHCLWithLimits("big.hcl", []byte(src), l)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), fmt.Sprintf("big.hcl is %d bytes, more than job_max_bytes = 1000", len(src)))
}

// The job files the README shows parse under the default limits, far
// from the depth limit: it leaves real jobs alone.
func TestParseHCL_ReadmeJobs(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	must.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```hcl\n(.*?)```").FindAllSubmatch(readme, -1)
	jobs := 0
	for _, b := range append(blocks, [][]byte{nil, []byte(fullHCL)}) {
		src := b[1]
		if !bytes.Contains(src, []byte(`job "`)) {
			continue
		}
		jobs++
		_, err := ParseHCL("readme.hcl", src)
		must.NoError(t, err, must.Sprintf("%s", src))
		d, err := hclMeasure(src)
		must.NoError(t, err)
		must.Less(t, 16, d, must.Sprintf("%s", src))
	}
	must.Greater(t, 1, jobs)
}

// The scanner never counts less than HCL nests: on random valid
// expressions the depth of the syntax tree HCL builds is at most twice
// what the scanner measured, plus the attribute and body around it. A
// bound linear in the measure is what keeps the parser's and evaluator's
// recursion bounded.
func TestHCLDepth_BoundsSyntaxTree(t *testing.T) {
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewSource(seed))
	worst := 0.0
	checked := 0
	for i := 0; i < 3000; i++ {
		g := &exprGen{r: r}
		src := "a = " + g.expr(6) + "\n"
		file, diags := hclparse.NewParser().ParseHCL([]byte(src), "gen.hcl")
		if diags.HasErrors() {
			continue
		}
		checked++
		measured, err := hclMeasure([]byte(src))
		must.NoError(t, err, must.Sprint(src))
		tree := treeDepth(file.Body.(*hclsyntax.Body))
		must.LessEq(t, 2*measured+3, tree, must.Sprintf("measured %d, tree %d: %s", measured, tree, src))
		if measured > 0 {
			worst = max(worst, float64(tree)/float64(measured))
		}
	}
	t.Logf("%d valid expressions; worst tree/measured ratio %.2f", checked, worst)
	must.Greater(t, 1000, checked)
}

// treeDepth is the depth of HCL's syntax tree below body.
func treeDepth(body *hclsyntax.Body) int {
	w := &depthWalker{}
	_ = hclsyntax.Walk(body, w)
	return w.deepest
}

type depthWalker struct{ depth, deepest int }

func (w *depthWalker) Enter(hclsyntax.Node) hcl.Diagnostics {
	w.depth++
	w.deepest = max(w.deepest, w.depth)
	return nil
}

func (w *depthWalker) Exit(hclsyntax.Node) hcl.Diagnostics {
	w.depth--
	return nil
}

// exprGen writes random HCL expressions using every construct that nests.
type exprGen struct{ r *rand.Rand }

func (g *exprGen) expr(budget int) string {
	if budget <= 0 {
		return g.leaf()
	}
	b := budget - 1
	switch g.r.Intn(17) {
	case 0:
		return "-" + g.expr(b)
	case 1:
		return "!" + g.expr(b)
	case 2:
		return g.expr(b) + " + " + g.expr(b) + " * " + g.expr(b)
	case 3:
		return g.expr(b) + " ? " + g.expr(b) + " : " + g.expr(b)
	case 4:
		return "[" + g.expr(b) + ", " + g.expr(b) + "]"
	case 5:
		return "{a = " + g.expr(b) + "\n b = " + g.expr(b) + "}"
	case 6:
		return "(" + g.expr(b) + ")"
	case 7:
		return "[" + g.expr(b) + "][" + g.expr(b) + "]"
	case 8:
		return "[" + g.expr(b) + "].x.y"
	case 9:
		return `"a${` + g.expr(b) + `}b"`
	case 10:
		return "<<EOT\nx ${" + g.expr(b) + "} y\n$${z}\nEOT\n"
	case 11:
		return "[for x in " + g.expr(b) + " : " + g.expr(b) + "]"
	case 12:
		return "{for k, v in " + g.expr(b) + " :\n k => " + g.expr(b) + "}"
	case 13:
		return "f(" + g.expr(b) + ", " + g.expr(b) + ")"
	case 14:
		return `"%{ if ` + g.expr(b) + ` }x%{ else }y%{ endif }"`
	case 15:
		return "/* [[( */ " + g.expr(b)
	default:
		return g.expr(b) + " == " + g.expr(b)
	}
}

func (g *exprGen) leaf() string {
	return []string{"1", "true", "x", `"s[{("`, "null", "1.5", "a-b"}[g.r.Intn(7)]
}

// A JSON job nested deeper than the limit, or listing more groups or tasks
// than allowed, is refused before it is decoded.
func TestParseJSON_LimitsBeforeDecode(t *testing.T) {
	l := structs.DefaultJobLimits()
	deep := `{"ID": "a", "Meta": ` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}`
	_, err := ParseJSON([]byte(deep))
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "nesting is deeper than job_max_depth = 64")

	// Key spellings encoding/json would match count too.
	for _, key := range []string{"TaskGroups", "taskgroups", `Task\u0047roups`} {
		src := `{"Job": {"ID": "a", "` + key + `": [` + strings.Repeat("{},", l.MaxGroups) + `{}]}}`
		_, err = ParseJSON([]byte(src))
		must.ErrorIs(t, err, structs.ErrInvalidRequest)
		must.StrContains(t, err.Error(), "more than job_max_groups = 100", must.Sprint(key))
	}
	tasks := `{"ID": "a", "TaskGroups": [` + strings.Repeat(`{"Tasks": [`+strings.Repeat(`{},`, 99)+`{}]},`, 5) + `{"Tasks": [{}]}]}`
	_, err = ParseJSON([]byte(tasks))
	must.ErrorContains(t, err, "more than job_max_tasks = 500")

	big := `{"ID": "` + strings.Repeat("x", l.MaxBytes) + `"}`
	_, err = ParseJSON([]byte(big))
	must.ErrorContains(t, err, fmt.Sprintf("job JSON is %d bytes, more than job_max_bytes = %d", len(big), l.MaxBytes))
}

// A megabyte of empty task groups costs a scan, not a decode: a few
// hundred kilobytes of allocation instead of tens of megabytes.
func TestParseJSON_ManyGroupsMemory(t *testing.T) {
	l := structs.DefaultJobLimits()
	groups := (l.MaxBytes - 64) / 3
	src := []byte(`{"Job": {"ID": "a", "TaskGroups": [` + strings.Repeat("{},", groups-1) + `{}]}}`)
	must.LessEq(t, l.MaxBytes, len(src))

	measure := func(parse func() error) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		must.Error(t, parse())
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	checked := measure(func() error { _, err := ParseJSONWithLimits(src, l); return err })
	// An eighth of the groups, with the group limit out of the way, are
	// decoded (the whole body would cost eight times as much).
	part := []byte(`{"Job": {"ID": "a", "TaskGroups": [` + strings.Repeat("{},", groups/8-1) + `{}]}}`)
	unchecked := l
	unchecked.MaxGroups = groups
	decoded := measure(func() error { _, err := ParseJSONWithLimits(part, unchecked); return err })
	t.Logf("%d groups in %d bytes: %d bytes allocated, refused by the scan; an eighth of them decoded: %d", groups, len(src), checked, decoded)
	must.Less(t, 1<<20, checked)
	must.Greater(t, 20*checked, decoded)
}

// Thousands of problems make an error of a few lines.
func TestParse_ErrorsCapped(t *testing.T) {
	var attrs strings.Builder
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&attrs, "      bogus%d = 1\n", i)
	}
	src := `job "a" {
  group "g" {
    task "t" {
` + attrs.String() + `
    }
  }
}`
	_, err := ParseHCL("many.hcl", []byte(src))
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	lines := strings.Split(err.Error(), "\n")
	must.Len(t, 21, lines)
	must.Eq(t, "and 980 more problems", lines[20])

	var fields strings.Builder
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&fields, `"Bogus%d": 1, `, i)
	}
	_, err = ParseJSON([]byte(`{` + fields.String() + `"ID": "a"}`))
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	lines = strings.Split(err.Error(), "\n")
	must.Len(t, 21, lines)
	must.Eq(t, "and 980 more problems", lines[20])
}

// Driver config values keep their types: numbers whole or not, bools,
// lists and objects. (Only raw_exec's command and args pass validation,
// so the conversion is checked here, below it.)
func TestConfigValues(t *testing.T) {
	src := `
n     = 3
ratio = 0.5
debug = true
opts  = { depth = 2, list = [1, "b"] }
`
	file, diags := hclparse.NewParser().ParseHCL([]byte(src), "c.hcl")
	must.False(t, diags.HasErrors())
	d := &decoder{}
	got := d.config(&hclAttrs{Body: file.Body})
	must.False(t, d.diags.HasErrors())
	want := map[string]any{
		"n": int64(3), "ratio": 0.5, "debug": true,
		"opts": map[string]any{"depth": int64(2), "list": []any{int64(1), "b"}},
	}
	must.Eq(t, want, got)

	job := plainConfig(map[string]any{
		"n": jsonNumber("3"), "ratio": jsonNumber("0.5"), "debug": true,
		"opts": map[string]any{"depth": jsonNumber("2"), "list": []any{jsonNumber("1"), "b"}},
	})
	must.Eq(t, want, job)
}

func jsonNumber(s string) json.Number { return json.Number(s) }

// A megabyte of empty group blocks once cost HCL over a gigabyte of
// allocation before the job's group limit could be checked; the block
// headers are counted by the scan instead.
func TestParseHCL_BlockCountsBeforeParse(t *testing.T) {
	l := structs.DefaultJobLimits()
	unit := "  group \"a\" {\n  }\n"
	src := []byte(`job "a" {` + "\n" + strings.Repeat(unit, (l.MaxBytes-64)/len(unit)) + "}\n")
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	_, err := ParseHCLWithLimits("groups.hcl", src, l)
	runtime.ReadMemStats(&m1)
	must.ErrorIs(t, err, structs.ErrInvalidRequest)
	must.StrContains(t, err.Error(), "groups.hcl:202: more than job_max_groups = 100 group blocks")
	t.Logf("%d bytes of group blocks: %d bytes allocated", len(src), m1.TotalAlloc-m0.TotalAlloc)
	must.Less(t, uint64(1<<20), m1.TotalAlloc-m0.TotalAlloc)

	l.MaxGroups, l.MaxTasks = 2, 3
	job := func(groups, tasks int) string {
		var b strings.Builder
		b.WriteString("job \"j\" {\n  meta {\n    group = \"not a block\"\n    task = \"nor this\"\n  }\n")
		for g := 0; g < groups; g++ {
			fmt.Fprintf(&b, "  group \"g%d\" {\n", g)
			for i := 0; i < tasks; i++ {
				fmt.Fprintf(&b, "    task \"t%d\" {\n      driver = \"raw_exec\"\n      config { command = \"/bin/true\" }\n    }\n", i)
			}
			b.WriteString("  }\n")
		}
		b.WriteString("}\n")
		return b.String()
	}
	_, err = ParseHCLWithLimits("j.hcl", []byte(job(1, 3)), l)
	must.NoError(t, err)
	_, err = ParseHCLWithLimits("j.hcl", []byte(job(2, 1)), l)
	must.NoError(t, err)
	_, err = ParseHCLWithLimits("j.hcl", []byte(job(3, 1)), l)
	must.ErrorContains(t, err, "more than job_max_groups = 2 group blocks")
	_, err = ParseHCLWithLimits("j.hcl", []byte(job(2, 2)), l)
	must.ErrorContains(t, err, "more than job_max_tasks = 3 task blocks")
}

// Out-of-range numbers in a job file are refused by name, never wrapped
// or truncated.
func TestParseHCL_OutOfRangeNumbers(t *testing.T) {
	for count, want := range map[string]string{
		"4611686018427387904":  "count 4611686018427387904 is more than group_max_count = 10000",
		"9223372036854775807":  "count 9223372036854775807 is more than group_max_count = 10000",
		"9223372036854775808":  "job.hcl:3,",
		"1e40":                 "job.hcl:3,",
		"-9223372036854775808": "count -9223372036854775808 must not be negative",
	} {
		src := strings.Replace(oneTask("count = COUNT", ""), "COUNT", count, 1)
		_, err := ParseHCL("job.hcl", []byte(src))
		must.ErrorIs(t, err, structs.ErrInvalidRequest, must.Sprint(count))
		must.StrContains(t, err.Error(), want, must.Sprint(count))
	}
}
