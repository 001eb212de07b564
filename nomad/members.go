package nomad

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/roamhq/roam/internal/upgrade"
	"github.com/roamhq/roam/structs"
)

// memberList is this server's view of the other servers, learned by probing
// retry_join addresses and every server heard of since. It stands in for a
// gossip layer: a server is alive while it answers probes.
type memberList struct {
	self *structs.ServerMember
	// failAfter is how long a server may go unheard before it is failed.
	failAfter time.Duration

	mu      sync.Mutex
	members map[string]*memberState // by server ID
	addrs   map[string]*probeAddr   // every address heard of, to probe
	// left holds servers removed from the Raft configuration on purpose,
	// with when: the leader must not add one back while it is still
	// answering on its way out.
	left map[string]time.Time
}

// probeAddr is an address the join loop probes.
type probeAddr struct {
	// permanent addresses (server_join) are probed for good; others are
	// forgotten once nothing has answered there for forgetAfter.
	permanent bool
	// last is when the address was learnt or last answered.
	last time.Time
}

// forgetAfter is how many failAfter periods an address that never answers
// stays on the probe list: long enough for a server that restarts to come
// back, short enough that made-up addresses from Joins do not pile up.
const forgetAfter = 10

type memberState struct {
	member   structs.ServerMember
	hasState bool
	lastSeen time.Time
}

func newMemberList(self *structs.ServerMember, failAfter time.Duration) *memberList {
	return &memberList{
		self:      self,
		failAfter: failAfter,
		members:   make(map[string]*memberState),
		addrs:     make(map[string]*probeAddr),
		left:      make(map[string]time.Time),
	}
}

// seen records a direct answer from (or call by) m.
func (l *memberList) seen(m structs.ServerMember, hasState bool) {
	if m.ID == "" || m.ID == l.self.ID {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if at, ok := l.left[m.ID]; ok {
		// A server that left is ignored until it has had time to go; one
		// heard from after that has come back.
		if time.Since(at) <= l.failAfter {
			return
		}
		delete(l.left, m.ID)
	}
	now := time.Now()
	l.members[m.ID] = &memberState{member: m, hasState: hasState, lastSeen: now}
	if pa, ok := l.addrs[m.Addr]; ok {
		pa.last = now
	} else {
		l.addrs[m.Addr] = &probeAddr{last: now}
	}
}

// markLeft forgets a server removed from the Raft configuration on purpose.
func (l *memberList) markLeft(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.members, id)
	l.left[id] = time.Now()
}

// lastSeen returns when server id last answered or called, if ever since
// this server started (or since it was marked left).
func (l *memberList) lastSeen(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.members[id]
	if !ok {
		return time.Time{}, false
	}
	return st.lastSeen, true
}

// maxProbeAddrs bounds the addresses a server probes: a Join names an
// address to probe, and a stream of Joins naming made-up addresses must
// not grow the probe list without end.
const maxProbeAddrs = 256

// learn records an address worth probing. It reports false when the list
// is full and addr was not added.
func (l *memberList) learn(addr string) bool {
	return l.addAddr(addr, false)
}

// learnPermanent records an address to probe for good (server_join).
func (l *memberList) learnPermanent(addr string) {
	l.addAddr(addr, true)
}

func (l *memberList) addAddr(addr string, permanent bool) bool {
	if addr == "" || addr == l.self.Addr {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if pa, ok := l.addrs[addr]; ok {
		pa.permanent = pa.permanent || permanent
		return true
	}
	if !permanent && len(l.addrs) >= maxProbeAddrs {
		return false
	}
	l.addrs[addr] = &probeAddr{permanent: permanent, last: time.Now()}
	return true
}

// answeredAt reports whether a server answered a probe at addr recently.
func (l *memberList) answeredAt(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, st := range l.members {
		if st.member.Addr == addr && time.Since(st.lastSeen) <= l.failAfter {
			return true
		}
	}
	return false
}

// isAlive reports whether the server with this ID answered recently.
func (l *memberList) isAlive(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.members[id]
	return ok && time.Since(st.lastSeen) <= l.failAfter
}

// targets returns the addresses to probe, sorted.
func (l *memberList) targets() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.addrs))
	for a, pa := range l.addrs {
		if !pa.permanent && time.Since(pa.last) > forgetAfter*l.failAfter {
			delete(l.addrs, a)
			continue
		}
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// list returns every known server including this one, sorted by name, with
// Status set from how recently each answered.
func (l *memberList) list() []*structs.ServerMember {
	l.mu.Lock()
	defer l.mu.Unlock()
	self := *l.self
	out := []*structs.ServerMember{&self}
	for _, st := range l.members {
		m := st.member
		m.Status = structs.MemberAlive
		if time.Since(st.lastSeen) > l.failAfter {
			m.Status = structs.MemberFailed
		}
		out = append(out, &m)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// alive returns the servers that answered recently, including this one.
func (l *memberList) alive() []*structs.ServerMember {
	var out []*structs.ServerMember
	for _, m := range l.list() {
		if m.Status == structs.MemberAlive {
			out = append(out, m)
		}
	}
	return out
}

// anyHasState reports whether an alive peer already belongs to a cluster.
func (l *memberList) anyHasState() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, st := range l.members {
		if st.hasState && time.Since(st.lastSeen) <= l.failAfter {
			return true
		}
	}
	return false
}

// joinLoop probes every known server address each JoinInterval, which is
// how servers find each other, bootstrap once BootstrapExpect of them agree,
// and notice when a server stops answering.
func (s *Server) joinLoop() {
	for _, addr := range s.config.RetryJoin {
		s.members.learnPermanent(addr)
	}
	ticker := time.NewTicker(s.config.JoinInterval)
	defer ticker.Stop()
	for {
		s.probeMembers()
		s.maybeBootstrap()
		select {
		case <-ticker.C:
		case <-s.shutdownCtx.Done():
			return
		}
	}
}

func (s *Server) probeMembers() {
	req := structs.ServerJoinRequest{Member: *s.selfMember(), HasState: s.hasRaftState.Load(), ClusterID: s.ClusterID()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		probe clusterProbe
	)
	for _, addr := range s.members.targets() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(s.shutdownCtx, s.config.MemberFailAfter)
			defer cancel()
			var resp structs.ServerJoinResponse
			if err := s.connPool.RPC(ctx, addr, "Status.Join", &req, &resp); err != nil {
				s.logger.Trace("probe failed", "address", addr, "error", err)
				return
			}
			if resp.Self.Region != s.config.Region {
				s.logger.Warn("server at join address is in another region; ignoring",
					"address", addr, "region", resp.Self.Region)
				return
			}
			if resp.Self.Addr != addr && !s.isRetryJoinAddr(addr) {
				// A server is known by the address it answers at; one that
				// claims another address is not taken at its word. (An
				// address from server_join may be a name for the one the
				// server advertises: the operator vouched for it.)
				s.logger.Warn("server at join address claims another address; ignoring",
					"address", addr, "claimed", resp.Self.Addr)
				return
			}
			if ours := req.ClusterID; ours != "" && resp.ClusterID != "" && resp.ClusterID != ours {
				s.logger.Warn("server at join address is in another cluster; ignoring",
					"address", addr, "its_cluster_id", resp.ClusterID, "cluster_id", ours)
				mu.Lock()
				probe.other++
				if resp.LeaderAddr != "" && resp.LeaderAddr == resp.Self.Addr {
					probe.otherLeader = &resp
				}
				mu.Unlock()
				return
			}
			if req.ClusterID != "" && resp.ClusterID == req.ClusterID {
				mu.Lock()
				probe.same++
				mu.Unlock()
			}
			s.learnClusterID(&resp)
			s.members.seen(resp.Self, resp.HasState)
			for _, m := range resp.Members {
				s.members.learn(m.Addr)
			}
		}()
	}
	wg.Wait()
	s.judgeClusterProbe(&probe)
}

// maybeBootstrap bootstraps a new cluster once BootstrapExpect servers
// without Raft state know each other. A server that finds a peer already in
// a cluster waits for that cluster's leader to add it instead.
func (s *Server) maybeBootstrap() {
	if s.hasRaftState.Load() {
		return
	}
	if cfg := s.raft.GetConfiguration(); cfg.Error() == nil && len(cfg.Configuration().Servers) > 0 {
		// A leader reached us and replicated its configuration.
		s.hasRaftState.Store(true)
		return
	}
	expect := s.config.BootstrapExpect
	if expect <= 1 || s.members.anyHasState() {
		return
	}
	alive := s.members.alive()
	if len(alive) < expect {
		return
	}
	if len(alive) > expect {
		// Two servers that saw different subsets would bootstrap different
		// clusters: refuse, and say so.
		s.logger.Error("more servers than bootstrap_expect found; not bootstrapping",
			"expect", expect, "found", len(alive))
		return
	}
	sort.Slice(alive, func(i, j int) bool { return alive[i].ID < alive[j].ID })
	if err := s.bootstrap(alive); err != nil {
		s.logger.Error("bootstrap failed", "error", err)
	}
}

// raftConfiguration returns the current Raft configuration.
func (s *Server) raftConfiguration() (raft.Configuration, uint64, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, 0, err
	}
	return f.Configuration(), f.Index(), nil
}

// minServerVersion is the oldest build among the servers this one knows
// (see serverBuilds).
func (s *Server) minServerVersion() (upgrade.Version, bool) {
	var voters []raft.Server
	if s.raft != nil {
		cfg, _, err := s.raftConfiguration()
		if err != nil {
			return upgrade.Oldest, false
		}
		voters = cfg.Servers
	}
	return upgrade.Min(serverBuilds(s.members.list(), voters))
}

// serverBuilds lists the build of every member, alive or failed (a failed
// server may come back, and lead), and "" (the oldest) for every server of
// the Raft configuration not yet heard from.
func serverBuilds(members []*structs.ServerMember, voters []raft.Server) []string {
	builds := make([]string, 0, len(members)+len(voters))
	known := make(map[string]bool, len(members))
	for _, m := range members {
		if m.Status == structs.MemberLeft {
			continue
		}
		known[m.ID] = true
		builds = append(builds, m.Tags["build"])
	}
	for _, srv := range voters {
		if !known[string(srv.ID)] {
			builds = append(builds, "")
		}
	}
	return builds
}
