package nomad

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/roamhq/roam/structs"
)

// With TLS on the RPC port, a peer is who its certificate says it is: the
// CA signed a certificate for server.<region>.roam, client.<region>.roam
// or cli.<region>.roam. With verify_server_hostname set, each surface of
// the port admits only the roles that belong on it:
//
//	Raft, and RPC outside a client session   server
//	a client session (yamux)                 server or client
//	a server-only RPC (serverOnlyMethods)    server
//
// A role counts only in this server's region. Without
// verify_server_hostname any certificate the CA signed is accepted
// everywhere, as Nomad does.

// peerRole is what a peer's certificate says it is.
type peerRole int

const (
	peerUnknown peerRole = iota
	peerClient
	peerServer
	peerCLI
)

func (r peerRole) String() string {
	switch r {
	case peerClient:
		return "client"
	case peerServer:
		return "server"
	case peerCLI:
		return "cli"
	}
	return "unknown"
}

// peerRoleFromTLS reads the role from the certificate the peer presented
// on conn. isTLS is false for a connection that is not TLS, whose role is
// then unknown. A certificate that names more than one role counts as the
// least trusted of them.
func peerRoleFromTLS(conn net.Conn) (role peerRole, isTLS bool) {
	tc, ok := conn.(*tls.Conn)
	if !ok {
		return peerUnknown, false
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return peerUnknown, true
	}
	var server, client, cli bool
	for _, name := range certs[0].DNSNames {
		switch {
		case roleName(name, "server"):
			server = true
		case roleName(name, "client"):
			client = true
		case roleName(name, "cli"):
			cli = true
		}
	}
	switch {
	case cli:
		return peerCLI, true
	case client:
		return peerClient, true
	case server:
		return peerServer, true
	}
	return peerUnknown, true
}

// roleName reports whether name is <role>.<region>.roam.
func roleName(name, role string) bool {
	rest, ok := strings.CutPrefix(name, role+".")
	if !ok {
		return false
	}
	region, ok := strings.CutSuffix(rest, ".roam")
	return ok && region != "" && !strings.Contains(region, ".")
}

// connPeer is what the server knows of who is on a connection.
type connPeer struct {
	role peerRole
	tls  bool
}

// upgradeTLS completes the TLS handshake on a connection that announced
// TLS, within the handshake timeout, and learns the peer's role. The
// tracked connection becomes the TLS one. ok is false once conn is closed.
func (s *Server) upgradeTLS(conn net.Conn) (tconn net.Conn, peer connPeer, ok bool) {
	tc := tls.Server(conn, s.config.TLS.IncomingRPCConfig())
	ctx, cancel := context.WithTimeout(s.shutdownCtx, s.config.RPCHandshakeTimeout)
	defer cancel()
	_ = conn.SetDeadline(time.Now().Add(s.config.RPCHandshakeTimeout))
	if err := tc.HandshakeContext(ctx); err != nil {
		s.connRejected("tls_handshake", "tls handshake failed; connection closed",
			"remote", conn.RemoteAddr(), "error", err)
		s.closeConn(conn)
		return nil, connPeer{}, false
	}
	_ = conn.SetDeadline(time.Time{})
	s.trackConn(conn, false)
	if !s.trackConn(tc, true) {
		tc.Close()
		return nil, connPeer{}, false
	}
	role, _ := peerRoleFromTLS(tc)
	if !certNamesRegion(tc, role, s.config.Region) {
		// A server or client of another region (the same CA may sign
		// several) has no role in this one.
		role = peerUnknown
	}
	return tc, connPeer{role: role, tls: true}, true
}

// certNamesRegion reports whether the peer's certificate on tc names role
// in region (<role>.<region>.roam). An unknown role names no region and
// passes: it is refused wherever a role is needed anyway.
func certNamesRegion(tc *tls.Conn, role peerRole, region string) bool {
	certs := tc.ConnectionState().PeerCertificates
	if role == peerUnknown || len(certs) == 0 {
		return true
	}
	want := role.String() + "." + region + ".roam"
	for _, name := range certs[0].DNSNames {
		if name == want {
			return true
		}
	}
	return false
}

// requireTLSFirst refuses a connection whose first byte is not the TLS
// byte when the port requires TLS. It reports whether conn may go on.
func (s *Server) requireTLSFirst(conn net.Conn, first byte, peer connPeer, inSession bool) bool {
	if !s.config.TLS.RPC() || peer.tls || inSession || first == structs.RPCTLS {
		return true
	}
	s.connRejected("tls_required", "plain connection refused: this server requires tls on its rpc port",
		"remote", conn.RemoteAddr(), "byte", fmt.Sprintf("0x%02x", first))
	s.closeConn(conn)
	return false
}

// requireServerPeer refuses a Raft connection, or an RPC connection
// outside a client session (server-to-server forwarding and joining), from
// a peer without a server certificate. It reports whether conn may go on.
func (s *Server) requireServerPeer(conn net.Conn, peer connPeer, surface string) bool {
	if !s.config.TLS.VerifyServerHostname() || peer.role == peerServer {
		return true
	}
	s.connRejected("role_not_server", surface+" refused: the peer's certificate is not a server certificate",
		"remote", conn.RemoteAddr(), "role", peer.role.String())
	s.closeConn(conn)
	return false
}

// requireSessionPeer refuses a client session from a peer whose
// certificate is neither a client's nor a server's (an agent running both
// dials with its server certificate).
func (s *Server) requireSessionPeer(conn net.Conn, peer connPeer) bool {
	if !s.config.TLS.VerifyServerHostname() || peer.role == peerServer || peer.role == peerClient {
		return true
	}
	s.connRejected("role_not_agent", "client session refused: the peer's certificate is not a client or server certificate",
		"remote", conn.RemoteAddr(), "role", peer.role.String())
	s.closeConn(conn)
	return false
}

// serverOnlyMethods are the RPCs a client certificate may not call in its
// session: those only servers call, on each other (joining, and finding
// and reaching a node's session on another server), and the operator's
// Raft and snapshot RPCs. A snapshot holds every node's secret, and a
// restore replaces all state, so a node holding one would act for every
// other node; an operator reaches these through a server agent's HTTP API
// (in process) or with a server certificate, never through a client's
// session.
var serverOnlyMethods = map[string]bool{
	"Status.Join":                 true,
	"Status.HasNodeConn":          true,
	"ClientRPC.Forward":           true,
	"Operator.RaftRemovePeerByID": true,
	"Operator.TransferLeadership": true,
	"Operator.SnapshotSave":       true,
	"Operator.SnapshotRead":       true,
	"Operator.SnapshotUpload":     true,
	"Operator.SnapshotRestore":    true,
}

// methodGuard returns the check a session's RPC stream applies to each
// method it is asked to call, or nil when every method is allowed.
func (s *Server) methodGuard(peer connPeer) func(method string) error {
	if !s.config.TLS.VerifyServerHostname() || peer.role == peerServer {
		return nil
	}
	return func(method string) error {
		if serverOnlyMethods[method] {
			return fmt.Errorf("%w: %s is a server-only rpc and the caller's certificate is a %s certificate",
				structs.ErrPermissionDenied, method, peer.role)
		}
		return nil
	}
}
