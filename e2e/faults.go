//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fault harness: agents on loopback addresses of their own, links
// between them cut and healed with nftables rules in a table the test
// owns, processes frozen with SIGSTOP (Agent.Pause). See DESIGN.md,
// "Testing under faults".
//
// Linux routes all of 127.0.0.0/8 to the loopback device, so any address
// in it can be bound without setup. Each test binary takes its addresses
// from a /16 of its own, picked from its pid (127.X.Y.N, X and Y from the
// pid, never 127.0.*), so that two test binaries on one machine do not
// cut each other's agents; the table name carries the pid too.

var loopback struct {
	mu   sync.Mutex
	next int
}

// loopbackIP hands out a loopback address that no running agent of this
// test binary has.
func loopbackIP(t testing.TB) string {
	t.Helper()
	loopback.mu.Lock()
	defer loopback.mu.Unlock()
	loopback.next++
	// Addresses are reused after 250 agents: by then the agents that had
	// them are long gone.
	n := 1 + (loopback.next-1)%250
	pid := os.Getpid()
	return fmt.Sprintf("127.%d.%d.%d", 1+pid%200, (pid/200)%256, n)
}

// nftTimeout bounds one nft invocation.
const nftTimeout = 10 * time.Second

// netFaults cuts and heals links between agents with nftables rules in a
// table of its own (inet family, one input-hook chain: on loopback every
// packet passes input, and a drop there is silent, as a lost packet on a
// network is; a drop at output would fail the sender's send at once).
// The table is deleted when the test ends, pass or fail.
type netFaults struct {
	t     testing.TB
	table string

	mu sync.Mutex
	// cuts are the one-way cuts in force: packets from src to dst are
	// dropped.
	cuts map[[2]string]bool
}

// newNetFaults creates the test's nftables table. A missing nft is a
// failure, not a skip: `make test` installs it.
func newNetFaults(t testing.TB) *netFaults {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("e2e: the fault harness needs nft (apt-get install -y nftables): %v", err)
	}
	nf := &netFaults{
		t:     t,
		table: fmt.Sprintf("roam_e2e_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6),
		cuts:  make(map[[2]string]bool),
	}
	if err := nf.run(fmt.Sprintf(`add table inet %[1]s
add chain inet %[1]s cuts { type filter hook input priority -10; policy accept; }
`, nf.table)); err != nil {
		t.Fatalf("e2e: create nftables table: %v", err)
	}
	t.Cleanup(func() {
		if err := nf.run(fmt.Sprintf("delete table inet %s\n", nf.table)); err != nil {
			t.Errorf("e2e: delete nftables table %s: %v", nf.table, err)
		}
	})
	return nf
}

// run feeds script to nft -f -; nft applies a script atomically.
func (nf *netFaults) run(script string) error {
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %w: %s\nscript:\n%s", err, strings.TrimSpace(out.String()), script)
	}
	return nil
}

// applyLocked replaces the chain's rules with the cuts in force, in one
// transaction.
func (nf *netFaults) applyLocked() error {
	var b strings.Builder
	fmt.Fprintf(&b, "flush chain inet %s cuts\n", nf.table)
	keys := make([][2]string, 0, len(nf.cuts))
	for k := range nf.cuts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		fmt.Fprintf(&b, "add rule inet %s cuts ip saddr %s ip daddr %s drop\n", nf.table, k[0], k[1])
	}
	return nf.run(b.String())
}

// ipOf returns a's own address; an agent without one cannot be cut apart
// from the others.
func (nf *netFaults) ipOf(a *Agent) string {
	nf.t.Helper()
	if a.IP == "" {
		nf.t.Fatalf("e2e: agent %s has no loopback address of its own (Opts.OwnAddrs)", a.Name)
	}
	return a.IP
}

// CutOneWay drops every packet from each of from to each of to. TCP
// needs both directions, so a connection between them stalls either way;
// what differs from a full cut is that packets the other side sends still
// arrive (and so are acted on).
func (nf *netFaults) CutOneWay(from, to []*Agent) {
	nf.t.Helper()
	nf.change(func() {
		for _, a := range from {
			for _, b := range to {
				if a != b {
					nf.cuts[[2]string{nf.ipOf(a), nf.ipOf(b)}] = true
				}
			}
		}
	})
}

// Cut drops every packet between each of group and each of others, both
// ways.
func (nf *netFaults) Cut(group, others []*Agent) {
	nf.t.Helper()
	nf.change(func() {
		for _, a := range group {
			for _, b := range others {
				if a != b {
					nf.cuts[[2]string{nf.ipOf(a), nf.ipOf(b)}] = true
					nf.cuts[[2]string{nf.ipOf(b), nf.ipOf(a)}] = true
				}
			}
		}
	})
}

// HealPair removes the cuts between a and b, both ways.
func (nf *netFaults) HealPair(a, b *Agent) {
	nf.t.Helper()
	nf.change(func() {
		delete(nf.cuts, [2]string{nf.ipOf(a), nf.ipOf(b)})
		delete(nf.cuts, [2]string{nf.ipOf(b), nf.ipOf(a)})
	})
}

// Heal removes every cut.
func (nf *netFaults) Heal() {
	nf.t.Helper()
	nf.change(func() { clear(nf.cuts) })
}

// Cuts returns how many one-way cuts are in force.
func (nf *netFaults) Cuts() int {
	nf.mu.Lock()
	defer nf.mu.Unlock()
	return len(nf.cuts)
}

func (nf *netFaults) change(edit func()) {
	nf.t.Helper()
	nf.mu.Lock()
	defer nf.mu.Unlock()
	edit()
	if err := nf.applyLocked(); err != nil {
		nf.t.Fatalf("e2e: %v", err)
	}
}

// Rules lists the table as nft shows it, for failure messages.
func (nf *netFaults) Rules() string {
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nft", "list", "table", "inet", nf.table).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(nft list: %v: %s)", err, out)
	}
	return string(out)
}
