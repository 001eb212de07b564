package command

import (
	"flag"
	"fmt"
	"io"
)

// parseOptionalID parses a status command's args: flags and at most one
// positional argument, an ID or ID prefix. hasID says whether one was
// given. A second argument prints the problem and the usage; what names
// the argument in that message ("<node-id>").
func parseOptionalID(fs *flag.FlagSet, args []string, errOut io.Writer, what string) (id string, hasID bool, code int, ok bool) {
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return "", false, code, false
	}
	switch len(pos) {
	case 0:
		return "", false, 0, true
	case 1:
		return pos[0], true, 0, true
	}
	fmt.Fprintf(errOut, "This command takes either no argument or one: %s\n", what)
	fs.Usage()
	return "", false, 1, false
}

// pickByPrefix chooses the object that id names among matches, the
// objects whose IDs start with id: one whose ID is id exactly wins over
// longer IDs it prefixes; otherwise there must be exactly one. For none,
// or for several (listed with table), it tells errOut and returns false.
// noun is the object's name in those messages ("node").
func pickByPrefix[T any](errOut io.Writer, noun, id string, matches []T, idOf func(T) string, table func([]T) string) (T, bool) {
	for _, m := range matches {
		if idOf(m) == id {
			return m, true
		}
	}
	var zero T
	switch len(matches) {
	case 0:
		fmt.Fprintf(errOut, "No %s(s) with prefix or ID %q found\n", noun, id)
		return zero, false
	case 1:
		return matches[0], true
	}
	fmt.Fprintf(errOut, "Prefix %q matched multiple %ss\n\n", id, noun)
	fmt.Fprint(errOut, table(matches))
	return zero, false
}
