package command

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestPickByPrefix(t *testing.T) {
	idOf := func(s string) string { return s }
	table := func(ss []string) string { return strings.Join(ss, "\n") + "\n" }
	cases := []struct {
		name, id string
		matches  []string
		want     string
		ok       bool
		errOut   string
	}{
		{name: "one", id: "ab", matches: []string{"abc"}, want: "abc", ok: true},
		{name: "exact wins over longer", id: "ab", matches: []string{"ab", "abc"}, want: "ab", ok: true},
		{name: "none", id: "zz", errOut: `No node(s) with prefix or ID "zz" found`},
		{name: "several", id: "a", matches: []string{"ab", "ac"}, errOut: "Prefix \"a\" matched multiple nodes\n\nab\nac\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errOut bytes.Buffer
			got, ok := pickByPrefix(&errOut, "node", tc.id, tc.matches, idOf, table)
			must.Eq(t, tc.ok, ok)
			must.Eq(t, tc.want, got)
			if tc.errOut == "" {
				must.Eq(t, "", errOut.String())
			} else {
				must.StrContains(t, errOut.String(), tc.errOut)
			}
		})
	}
}

func TestParseOptionalID(t *testing.T) {
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("x status", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Bool("verbose", false, "")
		return fs
	}
	var errOut bytes.Buffer
	id, has, _, ok := parseOptionalID(newFS(), nil, &errOut, "<x-id>")
	must.True(t, ok)
	must.False(t, has)
	must.Eq(t, "", id)

	id, has, _, ok = parseOptionalID(newFS(), []string{"abc", "-verbose"}, &errOut, "<x-id>")
	must.True(t, ok)
	must.True(t, has)
	must.Eq(t, "abc", id)

	_, _, code, ok := parseOptionalID(newFS(), []string{"a", "b"}, &errOut, "<x-id>")
	must.False(t, ok)
	must.Eq(t, 1, code)
	must.StrContains(t, errOut.String(), "This command takes either no argument or one: <x-id>")
}
