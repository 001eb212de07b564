package jobspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/roamhq/roam/structs"
)

// The parsers recurse: HCL's parser once per bracket, template and unary
// operator, its evaluator once per binary operator in a chain, and the
// decoders once per nested value. A job file deep enough overflows the
// goroutine stack, which no recover can catch: the agent dies. So the
// source is measured first, by scanners that do not recurse and allocate
// nothing in proportion to the input, and refused when it is larger or
// deeper than the limits allow.

// checkSize refuses a source over l.MaxBytes.
func checkSize(what string, src []byte, l structs.JobLimits) error {
	if len(src) > l.MaxBytes {
		return invalid("%s is %d bytes, more than job_max_bytes = %d", what, len(src), l.MaxBytes)
	}
	return nil
}

// hclFrame is one level of nesting in an HCL source.
type hclFrame struct {
	// kind is '(', '[', '{', 'i' (a template interpolation or directive),
	// '"' (a quoted template) or 'h' (a heredoc); 0 for the file itself.
	kind byte
	// ops counts operators and closed brackets since the last element
	// separator at this level: each can nest the expression one deeper
	// (-x, a+b+c, a ? b : c ? …, f(x)[y][z]).
	ops int
	// newlines is whether a newline ends an expression here (the file,
	// block bodies and object constructors), as in HCL's parser.
	newlines bool
	// forCheck is set on '{' until its first token shows whether it
	// starts a for expression, where newlines do not end expressions.
	forCheck bool
	// marker ends a heredoc; lineStart is whether the heredoc is at the
	// start of a line, where the marker may stand.
	marker    []byte
	lineStart bool
}

// hclScan measures how deep the HCL parser and evaluator would recurse on
// src and refuses it when that passes l.MaxDepth. It follows HCL's lexer
// (strings, heredocs, comments and template sequences) so that only real
// tokens count, and it may count more than the parser recurses, never
// less: every bracket and template is a level, and every operator or
// closed bracket adds one until the next ',' (or newline, where HCL ends
// an expression at one). Unbalanced brackets are refused too: the file
// cannot parse, and the scanner cannot follow the lexer through them.
//
// It also counts group and task block headers (the name at the start of
// a line in a block body, then a label) and refuses more than
// l.MaxGroups or l.MaxTasks of them: HCL builds a great deal for each
// block, over a gigabyte for a megabyte of empty groups, before the job's
// own limits could be checked.
func hclScan(filename string, src []byte, l structs.JobLimits) error {
	if !utf8.Valid(src) {
		return invalid("%s: the file is not valid UTF-8", filename)
	}
	s := &hclScanner{src: src, max: l.MaxDepth, maxGroups: l.MaxGroups, maxTasks: l.MaxTasks, filename: filename}
	s.stack = append(s.stack, hclFrame{newlines: true})
	return s.run()
}

// hclMeasure returns the depth hclScan measures for src (tests).
func hclMeasure(src []byte) (int, error) {
	s := &hclScanner{src: src, max: math.MaxInt, maxGroups: math.MaxInt, maxTasks: math.MaxInt, filename: "src"}
	s.stack = append(s.stack, hclFrame{newlines: true})
	err := s.run()
	return s.deepest, err
}

type hclScanner struct {
	filename string
	src      []byte
	i        int
	max      int
	stack    []hclFrame
	// ops is the sum of the frames' ops.
	ops int
	// deepest is the greatest depth seen.
	deepest int
	// groups and tasks count block headers, up to their limits.
	groups, tasks       int
	maxGroups, maxTasks int
}

func (s *hclScanner) top() *hclFrame { return &s.stack[len(s.stack)-1] }

func (s *hclScanner) errorf(format string, args ...any) error {
	line := 1 + bytes.Count(s.src[:min(s.i, len(s.src))], []byte{'\n'})
	return invalid("%s:%d: %s", s.filename, line, fmt.Sprintf(format, args...))
}

func (s *hclScanner) check() error {
	d := len(s.stack) - 1 + s.ops
	s.deepest = max(s.deepest, d)
	if d > s.max {
		return s.errorf("nesting is deeper than job_max_depth = %d", s.max)
	}
	return nil
}

func (s *hclScanner) push(f hclFrame) error {
	s.stack = append(s.stack, f)
	return s.check()
}

func (s *hclScanner) pop() {
	s.ops -= s.top().ops
	s.stack = s.stack[:len(s.stack)-1]
}

func (s *hclScanner) op() error {
	s.top().ops++
	s.ops++
	return s.check()
}

func (s *hclScanner) separator() {
	s.ops -= s.top().ops
	s.top().ops = 0
}

func (s *hclScanner) peek(off int) byte {
	if j := s.i + off; j < len(s.src) {
		return s.src[j]
	}
	return 0
}

func (s *hclScanner) run() error {
	for s.i < len(s.src) {
		var err error
		switch s.top().kind {
		case '"':
			err = s.quoted()
		case 'h':
			err = s.heredoc()
		default:
			err = s.expr()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func isIdentStart(c byte) bool { return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isIdentByte(c byte) bool  { return isIdentStart(c) || c == '-' || '0' <= c && c <= '9' }

// expr scans one token in expression mode.
func (s *hclScanner) expr() error {
	c := s.src[s.i]
	switch {
	case c == ' ' || c == '\t' || c == '\r':
		s.i++
		return nil
	case c == '\n':
		if s.top().newlines {
			s.separator()
		}
		s.i++
		return nil
	case c == '#' || c == '/' && s.peek(1) == '/':
		// A line comment ends at its newline, which is left to count.
		if j := bytes.IndexByte(s.src[s.i:], '\n'); j >= 0 {
			s.i += j
		} else {
			s.i = len(s.src)
		}
		return nil
	case c == '/' && s.peek(1) == '*':
		if j := bytes.Index(s.src[s.i+2:], []byte("*/")); j >= 0 {
			s.i += 2 + j + 2
		} else {
			s.i = len(s.src)
		}
		return nil
	}

	// Any other token settles whether a '{' opened a for expression.
	f := s.top()
	if f.forCheck {
		f.forCheck = false
		if c == 'f' && bytes.HasPrefix(s.src[s.i:], []byte("for")) && !isIdentByte(s.peek(3)) {
			f.newlines = false
		}
	}

	switch {
	case isIdentStart(c):
		start := s.i
		for s.i++; s.i < len(s.src) && isIdentByte(s.src[s.i]); s.i++ {
		}
		return s.blockHeader(start)
	case c == '"':
		s.i++
		return s.push(hclFrame{kind: '"'})
	case c == '<' && s.peek(1) == '<':
		if ok, err := s.heredocStart(); ok || err != nil {
			return err
		}
	case c == '(' || c == '[':
		s.i++
		return s.push(hclFrame{kind: c})
	case c == '{':
		s.i++
		return s.push(hclFrame{kind: '{', newlines: true, forCheck: true})
	case c == ')' || c == ']' || c == '}':
		return s.closer(c)
	case c == ',':
		s.separator()
		s.i++
		return nil
	case c == '=':
		// "==" is an operator; "=" and "=>" are not.
		if s.peek(1) == '=' {
			s.i += 2
			return s.op()
		}
		s.i++
		return nil
	}
	s.i++
	switch c {
	case '+', '-', '*', '/', '%', '!', '?', '<', '>', '&', '|', '.':
		return s.op()
	}
	return nil
}

// blockHeader counts the identifier at src[start:s.i] when it starts a
// group or task block: first on its line in a block body, followed by a
// label.
func (s *hclScanner) blockHeader(start int) error {
	name := s.src[start:s.i]
	isGroup := bytes.Equal(name, []byte("group"))
	if !isGroup && !bytes.Equal(name, []byte("task")) {
		return nil
	}
	if f := s.top(); !f.newlines || f.kind == '(' || f.kind == '[' {
		return nil
	}
	before := bytes.TrimRight(s.src[:start], " \t")
	if len(before) > 0 && before[len(before)-1] != '\n' && before[len(before)-1] != '{' {
		return nil
	}
	after := bytes.TrimLeft(s.src[s.i:], " \t")
	if len(after) == 0 || after[0] != '"' {
		return nil
	}
	if isGroup {
		s.groups++
		if s.groups > s.maxGroups {
			return s.errorf("more than job_max_groups = %d group blocks", s.maxGroups)
		}
		return nil
	}
	s.tasks++
	if s.tasks > s.maxTasks {
		return s.errorf("more than job_max_tasks = %d task blocks", s.maxTasks)
	}
	return nil
}

// closer pops the frame c closes. A '}' that closes a template sequence
// returns to the template around it.
func (s *hclScanner) closer(c byte) error {
	want := map[byte]byte{')': '(', ']': '[', '}': '{'}[c]
	k := s.top().kind
	switch {
	case k == want:
		s.i++
		s.pop()
		return s.op() // f(x)[y].z: a closed bracket may continue a chain
	case c == '}' && k == 'i':
		s.i++
		s.pop()
		return nil
	}
	return s.errorf("unbalanced %q", c)
}

// heredocStart reads "<<EOT" or "<<-EOT" and the newline after it. It
// reports false when the "<<" starts no heredoc.
func (s *hclScanner) heredocStart() (bool, error) {
	j := s.i + 2
	if j < len(s.src) && s.src[j] == '-' {
		j++
	}
	start := j
	if j >= len(s.src) || !isIdentStart(s.src[j]) {
		if j < len(s.src) && s.src[j] >= utf8.RuneSelf {
			return false, s.errorf("a heredoc marker must be ASCII letters, digits, '_' and '-'")
		}
		return false, nil
	}
	for j < len(s.src) && isIdentByte(s.src[j]) {
		j++
	}
	marker := s.src[start:j]
	if j < len(s.src) && s.src[j] >= utf8.RuneSelf {
		return false, s.errorf("a heredoc marker must be ASCII letters, digits, '_' and '-'")
	}
	if j < len(s.src) && s.src[j] == '\r' {
		j++
	}
	if j >= len(s.src) || s.src[j] != '\n' {
		return false, nil
	}
	s.i = j + 1
	return true, s.push(hclFrame{kind: 'h', marker: marker, lineStart: true})
}

// quoted scans one step of a quoted template.
func (s *hclScanner) quoted() error {
	switch c := s.src[s.i]; c {
	case '\\':
		if n := s.peek(1); n != 0 && n != '\n' && n != '\r' {
			s.i += 2
		} else {
			s.i++
		}
	case '"':
		s.i++
		s.pop()
	case '$', '%':
		return s.templateSequence(c)
	default:
		s.i++
	}
	return nil
}

// heredoc scans one step of a heredoc: at the start of a line, the whole
// line when it is the closing marker.
func (s *hclScanner) heredoc() error {
	f := s.top()
	if f.lineStart {
		f.lineStart = false
		if nl := bytes.IndexByte(s.src[s.i:], '\n'); nl >= 0 {
			if bytes.Equal(bytes.TrimSpace(s.src[s.i:s.i+nl]), f.marker) {
				// The newline after the marker ends the attribute.
				s.i += nl
				s.pop()
				return nil
			}
		}
	}
	switch c := s.src[s.i]; c {
	case '\n':
		f.lineStart = true
		s.i++
	case '$', '%':
		return s.templateSequence(c)
	default:
		s.i++
	}
	return nil
}

// templateSequence handles '$' or '%' in a template: "$${" and "%%{" are
// escapes; "${" and "%{" open a sequence. A directive (%{ if }, %{ for })
// nests what follows it until its end directive, so each one counts for
// the rest of its template.
func (s *hclScanner) templateSequence(c byte) error {
	switch {
	case s.peek(1) == c && s.peek(2) == '{':
		s.i += 3
		return nil
	case s.peek(1) == '{':
		s.i += 2
		if c == '%' {
			if err := s.op(); err != nil {
				return err
			}
		}
		return s.push(hclFrame{kind: 'i'})
	}
	s.i++
	return nil
}

// jsonFrame is one level of nesting in a JSON source.
type jsonFrame struct {
	kind      byte // '{' or '['
	expectKey bool
	key       []byte
	// counts is the counter this array's elements add to, or nil.
	counts *int
	limit  int
	what   string
}

// CheckJSON refuses a JSON job (bare or wrapped as a register request)
// that is larger than l.MaxBytes, nests deeper than l.MaxDepth, or lists
// more task groups or tasks than l allows, without decoding it. Callers
// that decode a body before handing it to ParseJSONWithLimits run it
// first; errors wrap structs.ErrInvalidRequest.
func CheckJSON(src []byte, l structs.JobLimits) error {
	if err := checkSize("job JSON", src, l); err != nil {
		return err
	}
	return checkJSON(src, l)
}

// checkJSON measures a JSON job without decoding it: its nesting depth,
// and the elements of every "TaskGroups" and "Tasks" array (keys compared
// as encoding/json would match them, so that none slips past). Decoding a
// million empty groups costs far more than the bytes that ask for them.
func checkJSON(src []byte, l structs.JobLimits) error {
	var (
		stack         []jsonFrame
		groups, tasks int
	)
	value := func() error {
		if len(stack) == 0 {
			return nil
		}
		f := &stack[len(stack)-1]
		if f.kind != '[' || f.counts == nil {
			return nil
		}
		*f.counts++
		if *f.counts > f.limit {
			return invalid("decoding job JSON: more than %s = %d", f.what, f.limit)
		}
		return nil
	}
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch c {
		case ' ', '\t', '\r', '\n', ':':
			if c == ':' && len(stack) > 0 {
				stack[len(stack)-1].expectKey = false
			}
		case ',':
			if len(stack) > 0 && stack[len(stack)-1].kind == '{' {
				stack[len(stack)-1].expectKey = true
			}
		case '"':
			j := i + 1
			for j < len(src) && src[j] != '"' {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if len(stack) > 0 && stack[len(stack)-1].expectKey {
				stack[len(stack)-1].key = src[i:min(j+1, len(src))]
			} else if err := value(); err != nil {
				return err
			}
			i = j
		case '{', '[':
			if err := value(); err != nil {
				return err
			}
			f := jsonFrame{kind: c, expectKey: c == '{'}
			if c == '[' && len(stack) > 0 && stack[len(stack)-1].kind == '{' {
				switch jsonKey(stack[len(stack)-1].key) {
				case "taskgroups":
					f.counts, f.limit, f.what = &groups, l.MaxGroups, "job_max_groups"
				case "tasks":
					f.counts, f.limit, f.what = &tasks, l.MaxTasks, "job_max_tasks"
				}
			}
			stack = append(stack, f)
			if len(stack) > l.MaxDepth {
				return invalid("decoding job JSON: nesting is deeper than job_max_depth = %d", l.MaxDepth)
			}
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		default:
			// A number or literal: one value, up to its delimiter.
			if err := value(); err != nil {
				return err
			}
			for i+1 < len(src) && strings.IndexByte(" \t\r\n,:]}[{\"", src[i+1]) < 0 {
				i++
			}
		}
	}
	return nil
}

// jsonKey returns a quoted JSON key unescaped and lowercased, as
// encoding/json folds it when matching struct fields; "" for keys too long
// to be one of the counted names.
func jsonKey(quoted []byte) string {
	if len(quoted) > 80 {
		return ""
	}
	var k string
	if err := json.Unmarshal(quoted, &k); err != nil {
		return ""
	}
	return strings.ToLower(k)
}
