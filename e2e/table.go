//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"strings"
)

// Table is CLI output in columns: a header line, then one line per row,
// columns separated by at least two spaces (as columnize and tabwriter lay
// them out).
type Table struct {
	Header []string
	Rows   [][]string
	Raw    string
}

var (
	headerCell = regexp.MustCompile(`\S+(?: \S+)*`)
	wideGap    = regexp.MustCompile(`\s{2,}|\t+`)
)

// ParseTable parses out. Cells are cut at the header's column positions, so
// empty cells and cells with single spaces survive; a row that does not line
// up with the header is split on wide gaps instead.
func ParseTable(out string) (*Table, error) {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimRight(l, " \r"))
		}
	}
	tab := &Table{Raw: out}
	if len(lines) == 0 {
		return nil, fmt.Errorf("no table in empty output")
	}
	header := lines[0]
	spans := headerCell.FindAllStringIndex(header, -1)
	for _, s := range spans {
		tab.Header = append(tab.Header, header[s[0]:s[1]])
	}
	for _, line := range lines[1:] {
		row, ok := cutAt(line, spans)
		if !ok {
			row = wideGap.Split(strings.TrimSpace(line), -1)
			if len(row) != len(spans) {
				return nil, fmt.Errorf("row %q does not match header %q", line, header)
			}
		}
		tab.Rows = append(tab.Rows, row)
	}
	return tab, nil
}

// cutAt cuts line at the header's column starts; ok is false when a cut
// would land inside a word.
func cutAt(line string, spans [][]int) ([]string, bool) {
	row := make([]string, len(spans))
	for i, s := range spans {
		start := s[0]
		if start > len(line) {
			continue // trailing empty cells
		}
		if start > 0 && line[start-1] != ' ' {
			return nil, false
		}
		end := len(line)
		if i+1 < len(spans) && spans[i+1][0] < end {
			end = spans[i+1][0]
		}
		row[i] = strings.TrimSpace(line[start:end])
	}
	return row, true
}

// col returns the index of the column named name, compared without case
// and spaces.
func (t *Table) col(name string) int {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, " ", "")) }
	for i, h := range t.Header {
		if norm(h) == norm(name) {
			return i
		}
	}
	return -1
}

// Column returns every row's value in the column named name.
func (t *Table) Column(name string) ([]string, error) {
	i := t.col(name)
	if i < 0 {
		return nil, fmt.Errorf("no column %q in header %q of:\n%s", name, t.Header, t.Raw)
	}
	out := make([]string, len(t.Rows))
	for r, row := range t.Rows {
		out[r] = row[i]
	}
	return out, nil
}

// Get returns row r's value in the column named name.
func (t *Table) Get(r int, name string) (string, error) {
	vals, err := t.Column(name)
	if err != nil {
		return "", err
	}
	return vals[r], nil
}
