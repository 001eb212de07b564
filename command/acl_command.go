package command

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("acl", "Bootstrap ACLs and manage policies and tokens")
	registerGroup("acl policy", "Manage ACL policies")
	registerGroup("acl token", "Manage ACL tokens")
	register("acl bootstrap", &Command{Synopsis: "Create the first management token", Run: runACLBootstrap})
	register("acl policy apply", &Command{Synopsis: "Create or update a policy from an HCL file", Run: runACLPolicyApply})
	register("acl policy list", &Command{Synopsis: "List policies", Run: runACLPolicyList})
	register("acl policy info", &Command{Synopsis: "Show a policy and its rules", Run: runACLPolicyInfo})
	register("acl policy delete", &Command{Synopsis: "Delete a policy", Run: runACLPolicyDelete})
	register("acl token create", &Command{Synopsis: "Create a token", Run: runACLTokenCreate})
	register("acl token list", &Command{Synopsis: "List tokens (accessors only)", Run: runACLTokenList})
	register("acl token info", &Command{Synopsis: "Show a token", Run: runACLTokenInfo})
	register("acl token self", &Command{Synopsis: "Show the token in use", Run: runACLTokenSelf})
	register("acl token update", &Command{Synopsis: "Change a token's name or policies", Run: runACLTokenUpdate})
	register("acl token delete", &Command{Synopsis: "Delete a token", Run: runACLTokenDelete})
}

// maxPolicyFile bounds a policy file read by the CLI, as the server does.
const maxPolicyFile = 64 << 10

// aclOneArg parses args for commands that take exactly one argument.
func aclOneArg(fs *flag.FlagSet, args []string, what string, errOut io.Writer) (string, int, bool) {
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return "", code, false
	}
	if len(pos) != 1 {
		fmt.Fprintf(errOut, "This command takes one argument: %s\n", what)
		fs.Usage()
		return "", 1, false
	}
	return pos[0], 0, true
}

func printToken(out io.Writer, t *api.ACLToken) {
	rows := [][]string{
		{"Accessor ID", t.AccessorID},
		{"Secret ID", t.SecretID},
		{"Name", t.Name},
		{"Type", t.Type},
		{"Global", fmt.Sprint(t.Global)},
		{"Policies", strings.Join(t.Policies, ",")},
		{"Create Time", t.CreateTime.String()},
		{"Create Index", fmt.Sprint(t.CreateIndex)},
		{"Modify Index", fmt.Sprint(t.ModifyIndex)},
	}
	for _, r := range rows {
		fmt.Fprintf(out, "%-13s= %s\n", r[0], r[1])
	}
}

func runACLBootstrap(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl bootstrap", "Usage: roam acl bootstrap [options]\n\n  Creates the first management token, once (see docs/acl.md for the reset).\n", errOut)
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	t, err := c.ACL().Bootstrap(nil)
	if err != nil {
		return fail(errOut, "bootstrapping ACLs", err)
	}
	if f.json {
		return jsonOr(out, errOut, t)
	}
	printToken(out, t)
	return 0
}

func jsonOr(out, errOut io.Writer, v any) int {
	if err := printJSON(out, v); err != nil {
		return fail(errOut, "printing", err)
	}
	return 0
}

func runACLPolicyApply(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl policy apply", "Usage: roam acl policy apply [options] <name> <file>\n\n  Creates or updates a policy from an HCL file (\"-\" reads stdin).\n", errOut)
	desc := fs.String("description", "", "the policy's description")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 2 {
		fmt.Fprintln(errOut, "This command takes two arguments: <name> <file>")
		fs.Usage()
		return 1
	}
	var r io.Reader = os.Stdin
	if pos[1] != "-" {
		file, err := os.Open(pos[1])
		if err != nil {
			return fail(errOut, "reading policy file", err)
		}
		defer file.Close()
		r = file
	}
	rules, err := io.ReadAll(io.LimitReader(r, maxPolicyFile+1))
	if err != nil {
		return fail(errOut, "reading policy file", err)
	}
	if len(rules) > maxPolicyFile {
		return fail(errOut, "reading policy file", fmt.Errorf("larger than %d bytes", maxPolicyFile))
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if err := c.ACL().PolicyApply(&api.ACLPolicy{Name: pos[0], Description: *desc, Rules: string(rules)}, nil); err != nil {
		return fail(errOut, "writing policy", err)
	}
	fmt.Fprintf(out, "Successfully wrote %q ACL policy!\n", pos[0])
	return 0
}

func runACLPolicyList(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl policy list", "Usage: roam acl policy list [options]\n", errOut)
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	ps, err := c.ACL().Policies(nil)
	if err != nil {
		return fail(errOut, "listing policies", err)
	}
	if f.json {
		return jsonOr(out, errOut, ps)
	}
	if len(ps) == 0 {
		fmt.Fprintln(out, "No policies found")
		return 0
	}
	rows := [][]string{{"Name", "Description"}}
	for _, p := range ps {
		rows = append(rows, []string{p.Name, p.Description})
	}
	fmt.Fprint(out, formatColumns(rows))
	return 0
}

func runACLPolicyInfo(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl policy info", "Usage: roam acl policy info [options] <name>\n", errOut)
	name, code, ok := aclOneArg(fs, args, "<name>", errOut)
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	p, err := c.ACL().PolicyInfo(name, nil)
	if err != nil {
		return fail(errOut, "reading policy", err)
	}
	if f.json {
		return jsonOr(out, errOut, p)
	}
	fmt.Fprintf(out, "Name        = %s\nDescription = %s\nCreateIndex = %d\nModifyIndex = %d\n\nRules\n\n%s\n",
		p.Name, p.Description, p.CreateIndex, p.ModifyIndex, p.Rules)
	return 0
}

func runACLPolicyDelete(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl policy delete", "Usage: roam acl policy delete [options] <name>\n", errOut)
	name, code, ok := aclOneArg(fs, args, "<name>", errOut)
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if err := c.ACL().PolicyDelete(name, nil); err != nil {
		return fail(errOut, "deleting policy", err)
	}
	fmt.Fprintf(out, "Successfully deleted %q ACL policy!\n", name)
	return 0
}

func runACLTokenCreate(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl token create", "Usage: roam acl token create [options]\n\n  Creates a token and prints it, secret included.\n", errOut)
	name := fs.String("name", "", "the token's name")
	typ := fs.String("type", "client", "client or management")
	var policies stringList
	fs.Var(&policies, "policy", "a policy the token holds (repeat for more)")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	t, err := c.ACL().TokenCreate(&api.ACLToken{Name: *name, Type: *typ, Policies: policies}, nil)
	if err != nil {
		return fail(errOut, "creating token", err)
	}
	if f.json {
		return jsonOr(out, errOut, t)
	}
	printToken(out, t)
	return 0
}

func runACLTokenList(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl token list", "Usage: roam acl token list [options]\n", errOut)
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	ts, err := c.ACL().Tokens(nil)
	if err != nil {
		return fail(errOut, "listing tokens", err)
	}
	if f.json {
		return jsonOr(out, errOut, ts)
	}
	rows := [][]string{{"Name", "Type", "Global", "Accessor ID", "Policies"}}
	for _, t := range ts {
		rows = append(rows, []string{t.Name, t.Type, fmt.Sprint(t.Global), t.AccessorID, strings.Join(t.Policies, ",")})
	}
	fmt.Fprint(out, formatColumns(rows))
	return 0
}

func runACLTokenInfo(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl token info", "Usage: roam acl token info [options] <accessor_id>\n", errOut)
	id, code, ok := aclOneArg(fs, args, "<accessor_id>", errOut)
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	t, err := c.ACL().TokenInfo(id, nil)
	if err != nil {
		return fail(errOut, "reading token", err)
	}
	if f.json {
		return jsonOr(out, errOut, t)
	}
	printToken(out, t)
	return 0
}

func runACLTokenSelf(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl token self", "Usage: roam acl token self [options]\n", errOut)
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	t, err := c.ACL().TokenSelf(nil)
	if err != nil {
		return fail(errOut, "reading token", err)
	}
	if f.json {
		return jsonOr(out, errOut, t)
	}
	printToken(out, t)
	return 0
}

func runACLTokenUpdate(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl token update", "Usage: roam acl token update [options] <accessor_id>\n\n  Sets the token's name and policies (the policies given replace the old ones).\n", errOut)
	name := fs.String("name", "", "the token's new name (empty keeps it)")
	var policies stringList
	fs.Var(&policies, "policy", "a policy the token holds (repeat for more; none keeps them)")
	id, code, ok := aclOneArg(fs, args, "<accessor_id>", errOut)
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	t, err := c.ACL().TokenInfo(id, nil)
	if err != nil {
		return fail(errOut, "reading token", err)
	}
	if *name != "" {
		t.Name = *name
	}
	if len(policies) > 0 {
		t.Policies = policies
	}
	t.SecretID = ""
	t, err = c.ACL().TokenUpdate(t, nil)
	if err != nil {
		return fail(errOut, "updating token", err)
	}
	if f.json {
		return jsonOr(out, errOut, t)
	}
	printToken(out, t)
	return 0
}

func runACLTokenDelete(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("acl token delete", "Usage: roam acl token delete [options] <accessor_id>\n", errOut)
	id, code, ok := aclOneArg(fs, args, "<accessor_id>", errOut)
	if !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	if err := c.ACL().TokenDelete(id, nil); err != nil {
		return fail(errOut, "deleting token", err)
	}
	fmt.Fprintf(out, "Token %s successfully deleted\n", id)
	return 0
}
