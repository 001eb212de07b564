package command

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/roamhq/roam/api"
)

// apiFlags are the flags every command that talks to an agent takes.
type apiFlags struct {
	address string
	region  string
	json    bool
	token   string
	tls     api.TLSConfig
}

// newAPIFlagSet returns a flag set for the command name with the common
// flags registered; usage is printed before the flag list on -h.
func newAPIFlagSet(name, usage string, errOut io.Writer) (*flag.FlagSet, *apiFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, usage)
		fmt.Fprintln(errOut, "\nOptions:")
		fs.PrintDefaults()
	}
	f := &apiFlags{}
	fs.StringVar(&f.address, "address", api.DefaultConfig().Address,
		"HTTP address of the agent (or set "+api.AddressEnv+")")
	fs.StringVar(&f.region, "region", "", "region to send the request to")
	fs.BoolVar(&f.json, "json", false, "print the raw JSON of the result")
	fs.StringVar(&f.token, "token", "", "secret of the ACL token to send (or set "+api.TokenEnv+")")
	env := api.DefaultConfig().TLSConfig
	fs.StringVar(&f.tls.CACert, "ca-cert", env.CACert,
		"PEM file of the CA that signed the agent's certificate (or set "+api.CACertEnv+")")
	fs.StringVar(&f.tls.ClientCert, "client-cert", env.ClientCert,
		"PEM file of the certificate to present to the agent (or set "+api.ClientCertEnv+")")
	fs.StringVar(&f.tls.ClientKey, "client-key", env.ClientKey,
		"PEM file of the client certificate's key (or set "+api.ClientKeyEnv+")")
	fs.StringVar(&f.tls.TLSServerName, "tls-server-name", env.TLSServerName,
		"name the agent's certificate must carry, if not the address's host (or set "+api.TLSServerNameEnv+")")
	return fs, f
}

// client returns an API client for the flags.
func (f *apiFlags) client() (*api.Client, error) {
	return api.NewClient(&api.Config{Address: f.address, Region: f.region, TLSConfig: f.tls, SecretID: f.token})
}

// parseArgs parses args with flags allowed before, between and after the
// positional arguments, which it returns. ok is false when the command
// should exit with code: 0 after -h, 1 on a bad flag.
func parseArgs(fs *flag.FlagSet, args []string) (positional []string, code int, ok bool) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, 0, false
			}
			return nil, 1, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, 0, true
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), 0, true
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// parseNoArgs is parseArgs for commands that take only flags: stray
// arguments print usage and fail.
func parseNoArgs(fs *flag.FlagSet, args []string, errOut io.Writer) (code int, ok bool) {
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code, false
	}
	if len(pos) > 0 {
		fmt.Fprintln(errOut, "This command takes no arguments")
		fs.Usage()
		return 1, false
	}
	return 0, true
}

// printJSON writes v as indented JSON.
func printJSON(out io.Writer, v any) error {
	buf, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	_, err = fmt.Fprintln(out, string(buf))
	return err
}

// fail prints "Error <doing>: <err>" to errOut and returns exit code 1.
func fail(errOut io.Writer, doing string, err error) int {
	fmt.Fprintf(errOut, "Error %s: %v\n", doing, err)
	return 1
}

// formatColumns aligns rows (the first one being the header) into columns
// separated by two spaces; the last column is not padded.
func formatColumns(rows [][]string) string {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len([]rune(cell)))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			line.WriteString(cell)
			if i < len(row)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-len([]rune(cell))))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteByte('\n')
	}
	return b.String()
}

// formatKV aligns key/value pairs as "Key   = value" lines.
func formatKV(pairs [][2]string) string {
	width := 0
	for _, p := range pairs {
		width = max(width, len([]rune(p[0])))
	}
	var b strings.Builder
	for _, p := range pairs {
		b.WriteString(p[0])
		b.WriteString(strings.Repeat(" ", width-len([]rune(p[0]))))
		b.WriteString(" = ")
		b.WriteString(p[1])
		b.WriteByte('\n')
	}
	return b.String()
}

// shortID is the first 8 characters of an ID, as lists show them.
func shortID(id string, verbose bool) string {
	if verbose || len(id) <= 8 {
		return id
	}
	return id[:8]
}

// orNone shows an empty value as <none>.
func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// registerGroup registers name as a command that lists its subcommands.
func registerGroup(name, synopsis string) {
	register(name, &Command{
		Synopsis: synopsis,
		Run: func(args []string, out, errOut io.Writer) int {
			if len(args) > 0 && args[0] != "-h" && args[0] != "-help" && args[0] != "--help" {
				fmt.Fprintf(errOut, "roam %s: unknown subcommand %q\n\n", name, args[0])
				usage(errOut, name+" ")
				return 1
			}
			usage(out, name+" ")
			return 0
		},
	})
}
