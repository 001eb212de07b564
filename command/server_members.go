package command

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/roamhq/roam/api"
)

func init() {
	registerGroup("server", "Interact with servers")
	register("server members", &Command{Synopsis: "List the servers and their status", Run: runServerMembers})
}

const serverMembersUsage = `Usage: roam server members [options]

  Lists the servers the agent knows, with their liveness and which one
  leads.
`

func runServerMembers(args []string, out, errOut io.Writer) int {
	fs, f := newAPIFlagSet("server members", serverMembersUsage, errOut)
	detailed := fs.Bool("detailed", false, "also show each member's tags")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	c, err := f.client()
	if err != nil {
		return fail(errOut, "creating API client", err)
	}
	members, err := c.Agent().Members()
	if err != nil {
		return fail(errOut, "querying servers", err)
	}
	if f.json {
		if err := printJSON(out, members); err != nil {
			return fail(errOut, "printing servers", err)
		}
		return 0
	}
	fmt.Fprint(out, membersTable(members.Members, *detailed))
	return 0
}

// membersTable renders servers in Nomad's server members columns, sorted
// by region, datacenter and name.
func membersTable(members []*api.AgentMember, detailed bool) string {
	sorted := append([]*api.AgentMember(nil), members...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Tags["region"] != b.Tags["region"] {
			return a.Tags["region"] < b.Tags["region"]
		}
		if a.Tags["dc"] != b.Tags["dc"] {
			return a.Tags["dc"] < b.Tags["dc"]
		}
		return a.Name < b.Name
	})
	header := []string{"Name", "Address", "Port", "Status", "Leader", "Raft Version", "Build", "Datacenter", "Region"}
	if detailed {
		header = append(header, "Tags")
	}
	rows := [][]string{header}
	for _, m := range sorted {
		row := []string{
			m.Name, m.Addr, strconv.Itoa(int(m.Port)), m.Status,
			strconv.FormatBool(m.Tags["leader"] == "true"),
			dashIfEmpty(m.Tags["raft_vsn"]), dashIfEmpty(m.Tags["build"]),
			m.Tags["dc"], m.Tags["region"],
		}
		if detailed {
			row = append(row, joinTags(m.Tags))
		}
		rows = append(rows, row)
	}
	return formatColumns(rows)
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func joinTags(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+tags[k])
	}
	return strings.Join(parts, ",")
}
