// Package command holds roam's CLI: the agent and the subcommands that talk
// to an agent's HTTP API.
package command

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// Command is one subcommand. Run gets the arguments after the command's
// name and returns the process exit code.
type Command struct {
	Synopsis string
	// Hidden commands are internal (started by roam itself) and left out
	// of usage.
	Hidden bool
	Run    func(args []string, out, errOut io.Writer) int
}

// commands maps a subcommand's words ("node status") to it. Each file that
// defines commands adds them in an init function.
var commands = map[string]*Command{}

func register(name string, c *Command) {
	if _, dup := commands[name]; dup {
		panic("command: " + name + " registered twice")
	}
	commands[name] = c
}

// Run dispatches args to the longest matching subcommand.
func Run(args []string, out, errOut io.Writer) int {
	for n := len(args); n > 0; n-- {
		name := strings.Join(args[:n], " ")
		if c, ok := commands[name]; ok {
			return c.Run(args[n:], out, errOut)
		}
	}
	if len(args) > 0 && args[0] != "-h" && args[0] != "-help" && args[0] != "--help" && args[0] != "help" {
		fmt.Fprintf(errOut, "roam: unknown command %q\n\n", strings.Join(args, " "))
		usage(errOut, "")
		return 1
	}
	usage(out, "")
	return 0
}

// usage lists the subcommands under prefix.
func usage(w io.Writer, prefix string) {
	fmt.Fprintln(w, "Usage: roam <command> [args]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for name := range commands {
		if strings.HasPrefix(name, prefix) && !commands[name].Hidden {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "    %-40s %s\n", name, commands[name].Synopsis)
	}
}
