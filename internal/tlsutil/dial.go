package tlsutil

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// WrapClient turns a freshly dialed connection to a Roam RPC port into a
// TLS one: it sends tlsByte (the protocol byte that announces TLS), then
// completes the handshake within timeout. The caller then writes the inner
// protocol byte. On error conn is closed.
func WrapClient(conn net.Conn, tlsByte byte, cfg *tls.Config, timeout time.Duration) (net.Conn, error) {
	if timeout > 0 {
		_ = conn.SetDeadline(time.Now().Add(timeout))
	}
	if _, err := conn.Write([]byte{tlsByte}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("tls: announce tls: %w", err)
	}
	tc := tls.Client(conn, cfg)
	if err := tc.Handshake(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("tls handshake with %s: %w", conn.RemoteAddr(), err)
	}
	_ = conn.SetDeadline(time.Time{})
	return tc, nil
}
