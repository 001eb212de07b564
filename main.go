// Command roam is the Roam agent and CLI.
package main

import (
	"os"

	"github.com/roamhq/roam/command"
)

func main() {
	os.Exit(command.Run(os.Args[1:], os.Stdout, os.Stderr))
}
