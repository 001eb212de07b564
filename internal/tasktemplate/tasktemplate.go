// Package tasktemplate renders a task's template blocks: Go text/template
// with the functions Nomad's templates offer that need neither Consul
// nor Vault. The servers parse a template when a job is registered
// (Parse), so that a bad one is refused then; the client renders it
// (Render) before the task starts, reading files through an os.Root on
// the task directory so that nothing outside it is read.
package tasktemplate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/template"
)

// Bounds on what one template may be and make.
const (
	// MaxTemplateBytes bounds a template's text.
	MaxTemplateBytes = 64 << 10
	// MaxOutputBytes bounds what rendering one template may produce.
	MaxOutputBytes = 4 << 20
	// MaxFileBytes bounds a file the file function reads.
	MaxFileBytes = 1 << 20
)

// ErrTooLarge is a template, its output or a file it reads over a bound.
var ErrTooLarge = errors.New("over its size limit")

// Env is what the env function reads.
type Env map[string]string

// funcs are the template functions; env and file are bound per render.
func funcs(env Env, root *os.Root) template.FuncMap {
	return template.FuncMap{
		"env": func(name string) string { return env[name] },
		"file": func(path string) (string, error) {
			if root == nil {
				return "", errors.New("file: no task directory")
			}
			b, err := ReadFile(root, path, MaxFileBytes)
			if err != nil {
				return "", fmt.Errorf("file %q: %w", path, err)
			}
			return string(b), nil
		},
		"toUpper":    strings.ToUpper,
		"toLower":    strings.ToLower,
		"toTitle":    strings.ToTitle,
		"trimSpace":  strings.TrimSpace,
		"trim":       func(cut, s string) string { return strings.Trim(s, cut) },
		"split":      func(sep, s string) []string { return strings.Split(s, sep) },
		"join":       func(sep string, parts []string) string { return strings.Join(parts, sep) },
		"replaceAll": func(from, to, s string) string { return strings.ReplaceAll(s, from, to) },
		"contains":   func(sub, s string) bool { return strings.Contains(s, sub) },
		"hasPrefix":  func(prefix, s string) bool { return strings.HasPrefix(s, prefix) },
		"hasSuffix":  func(suffix, s string) bool { return strings.HasSuffix(s, suffix) },
		"parseInt":   func(s string) (int64, error) { return strconv.ParseInt(strings.TrimSpace(s), 10, 64) },
		"parseFloat": func(s string) (float64, error) { return strconv.ParseFloat(strings.TrimSpace(s), 64) },
		"parseBool":  func(s string) (bool, error) { return strconv.ParseBool(strings.TrimSpace(s)) },
		"parseJSON": func(s string) (any, error) {
			var v any
			err := json.Unmarshal([]byte(s), &v)
			return v, err
		},
		"toJSON": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"toJSONPretty": func(v any) (string, error) {
			b, err := json.MarshalIndent(v, "", "  ")
			return string(b), err
		},
		"base64Encode": func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
		"base64Decode": func(s string) (string, error) {
			b, err := base64.StdEncoding.DecodeString(s)
			return string(b), err
		},
		"add":      func(a, b int64) int64 { return a + b },
		"subtract": func(a, b int64) int64 { return a - b },
		"multiply": func(a, b int64) int64 { return a * b },
		"divide": func(a, b int64) (int64, error) {
			if b == 0 {
				return 0, errors.New("divide by zero")
			}
			return a / b, nil
		},
		"loop": func(n int64) ([]int64, error) {
			if n < 0 || n > 10000 {
				return nil, fmt.Errorf("loop %d: from 0 to 10000", n)
			}
			out := make([]int64, n)
			for i := range out {
				out[i] = int64(i)
			}
			return out, nil
		},
		"sortStrings": func(s []string) []string {
			out := append([]string(nil), s...)
			sort.Strings(out)
			return out
		},
	}
}

// Parse parses text as a template, with the delimiters (empty: "{{" and
// "}}"): what the servers check at registration. An unknown function is
// an error that names it.
func Parse(name, text, left, right string) (*template.Template, error) {
	return parse(name, text, left, right, funcs(nil, nil))
}

func parse(name, text, left, right string, fm template.FuncMap) (*template.Template, error) {
	if len(text) > MaxTemplateBytes {
		return nil, fmt.Errorf("template: %w (%d bytes, at most %d)", ErrTooLarge, len(text), MaxTemplateBytes)
	}
	return template.New(name).Delims(left, right).Option("missingkey=zero").Funcs(fm).Parse(text)
}

// Render renders text with env and files read beneath root (nil: the
// file function fails). The output is bounded by MaxOutputBytes.
func Render(name, text, left, right string, env Env, root *os.Root) ([]byte, error) {
	t, err := parse(name, text, left, right, funcs(env, root))
	if err != nil {
		return nil, err
	}
	var buf limitedBuffer
	if err := t.Execute(&buf, nil); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// limitedBuffer fails a write past MaxOutputBytes.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > MaxOutputBytes {
		return 0, fmt.Errorf("template output: %w (%d bytes)", ErrTooLarge, MaxOutputBytes)
	}
	return b.Buffer.Write(p)
}

// ParseEnv reads a rendered env template: KEY=VALUE lines; blank lines
// and lines starting with # are skipped. A line without "=" or with a
// key that is not a variable name is an error naming the line.
func ParseEnv(b []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(strings.TrimPrefix(k, "export "))
		if !ok || !validEnvName(k) {
			return nil, fmt.Errorf("env template line %d: %q is not KEY=VALUE", i+1, line)
		}
		out[k] = v
	}
	return out, nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// ErrNotRegular is a path that is not a regular file: a FIFO, a device, a
// socket or a directory a task put where a file was expected.
var ErrNotRegular = errors.New("not a regular file")

// ReadFile reads name beneath root, at most limit bytes. It opens without
// blocking (a FIFO the task left there would hold the reader forever) and
// reads only a regular file.
func ReadFile(root *os.Root, name string, limit int) ([]byte, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%s)", ErrNotRegular, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)
	}
	return b, nil
}
