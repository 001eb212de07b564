package upgrade

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Version
		err  bool
	}{
		{"0.2.0", Version{0, 2, 0}, false},
		{"v1.10.3", Version{1, 10, 3}, false},
		{"0.2.0-dev", Version{0, 2, 0}, false},
		{"0.2.0+abc", Version{0, 2, 0}, false},
		{"", Oldest, true},
		{"0.2", Oldest, true},
		{"0.2.x", Oldest, true},
		{"1.2.3.4", Oldest, true},
		{"-1.2.3", Oldest, true},
		{"99999999999.0.0", Oldest, true},
	} {
		got, err := Parse(c.in)
		must.Eq(t, c.want, got, must.Sprint(c.in))
		must.Eq(t, c.err, err != nil, must.Sprintf("%q: %v", c.in, err))
	}
}

func TestMinAndEnabled(t *testing.T) {
	f := Feature{Name: "f", Since: MustParse("0.2.0")}
	for _, c := range []struct {
		name    string
		builds  []string
		min     string
		ok      bool
		enabled bool
	}{
		{"no servers", nil, "0.0.0", false, false},
		{"all new", []string{"0.2.0", "0.2.0", "0.2.0"}, "0.2.0", true, true},
		{"all newer", []string{"0.3.1", "1.0.0", "0.2.5"}, "0.2.5", true, true},
		{"one old", []string{"0.2.0", "0.1.0", "0.2.0"}, "0.1.0", true, false},
		{"one that does not say", []string{"0.2.0", "", "0.2.0"}, "0.0.0", true, false},
		{"one unreadable", []string{"0.2.0", "banana", "0.3.0"}, "0.0.0", true, false},
		{"minor beats patch", []string{"0.10.0", "0.9.9"}, "0.9.9", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			min, ok := Min(c.builds)
			must.Eq(t, c.min, min.String())
			must.Eq(t, c.ok, ok)
			must.Eq(t, c.enabled, ok && f.Enabled(min))
		})
	}
}
