package agent

import (
	"context"
	"net"
	"net/http"

	"github.com/hashicorp/go-hclog"
)

// HTTPServer serves the v1 HTTP API. (Handlers are being written.)
type HTTPServer struct {
	agent    *Agent
	logger   hclog.Logger
	listener net.Listener
	srv      *http.Server
}

// NewHTTPServer starts serving the API on ln.
func NewHTTPServer(a *Agent, ln net.Listener, logger hclog.Logger) *HTTPServer {
	s := &HTTPServer{agent: a, logger: logger, listener: ln}
	mux := http.NewServeMux()
	s.srv = &http.Server{Handler: mux}
	go s.srv.Serve(ln)
	return s
}

// Addr is the bound address.
func (s *HTTPServer) Addr() string { return s.listener.Addr().String() }

// Shutdown stops accepting and waits for in-flight requests.
func (s *HTTPServer) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }
