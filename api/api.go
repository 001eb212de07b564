// Package api is a Go client for Roam's HTTP API. Its types carry the same
// JSON names as the API (and as Nomad's), and it imports nothing of Roam's.
package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultAddress is where a local agent's HTTP API listens.
const DefaultAddress = "http://127.0.0.1:4646"

// AddressEnv names the environment variable that overrides DefaultAddress.
const AddressEnv = "ROAM_ADDR"

// TokenEnv names the environment variable that holds the ACL token's
// secret sent with every request.
const TokenEnv = "ROAM_TOKEN"

// Environment variables DefaultConfig reads for TLS, as the CLI flags
// -ca-cert, -client-cert, -client-key and -tls-server-name.
const (
	CACertEnv        = "ROAM_CACERT"
	ClientCertEnv    = "ROAM_CLIENT_CERT"
	ClientKeyEnv     = "ROAM_CLIENT_KEY"
	TLSServerNameEnv = "ROAM_TLS_SERVER_NAME"
)

// TLSConfig is how a Client speaks HTTPS to an agent.
type TLSConfig struct {
	// CACert is the PEM file of the CA that signed the agent's
	// certificate; empty means the system's roots.
	CACert string
	// ClientCert and ClientKey are the PEM files of the certificate to
	// present, for an agent with verify_https_client.
	ClientCert string
	ClientKey  string
	// TLSServerName is the name the agent's certificate must carry, when
	// it is not the host in Address (server.global.roam, say).
	TLSServerName string
}

func (t TLSConfig) empty() bool { return t == TLSConfig{} }

// Config configures a Client. DefaultConfig works as is against a local
// agent.
type Config struct {
	// TLSConfig is used for an https Address when HTTPClient is nil.
	TLSConfig TLSConfig
	// Address is the agent's HTTP address, such as http://127.0.0.1:4646;
	// a bare host:port means http.
	Address string
	// Region is sent with every request that does not name its own.
	Region string
	// HTTPClient makes the requests. It should have no overall timeout:
	// blocking queries wait for minutes.
	HTTPClient *http.Client
	// WaitTime is the wait of a blocking query whose options give none.
	WaitTime time.Duration
	// SecretID is the ACL token sent as X-Nomad-Token with every request
	// whose options name none.
	SecretID string
}

// DefaultConfig returns a Config for the agent named by ROAM_ADDR, or the
// local agent.
func DefaultConfig() *Config {
	c := &Config{Address: DefaultAddress, SecretID: os.Getenv(TokenEnv)}
	if addr := os.Getenv(AddressEnv); addr != "" {
		c.Address = addr
	}
	c.TLSConfig = TLSConfig{
		CACert:        os.Getenv(CACertEnv),
		ClientCert:    os.Getenv(ClientCertEnv),
		ClientKey:     os.Getenv(ClientKeyEnv),
		TLSServerName: os.Getenv(TLSServerNameEnv),
	}
	return c
}

// tlsClientConfig builds the *tls.Config t describes.
func (t TLSConfig) tlsClientConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.TLSServerName}
	if t.CACert != "" {
		pem, err := os.ReadFile(t.CACert)
		if err != nil {
			return nil, fmt.Errorf("api: read ca cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("api: ca cert %s holds no PEM certificate", t.CACert)
		}
		c.RootCAs = pool
	}
	switch {
	case t.ClientCert != "" && t.ClientKey != "":
		pair, err := tls.LoadX509KeyPair(t.ClientCert, t.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("api: load client cert: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	case t.ClientCert != "" || t.ClientKey != "":
		return nil, fmt.Errorf("api: a client cert needs its key, and a key its cert")
	}
	return c, nil
}

// Client talks to one agent.
type Client struct {
	config  Config
	baseURL *url.URL
}

// NewClient returns a client for config; empty fields take their defaults.
func NewClient(config *Config) (*Client, error) {
	c := *DefaultConfig()
	if config != nil {
		if config.Address != "" {
			c.Address = config.Address
		}
		c.Region = config.Region
		c.HTTPClient = config.HTTPClient
		c.WaitTime = config.WaitTime
		if config.SecretID != "" {
			c.SecretID = config.SecretID
		}
		if !config.TLSConfig.empty() {
			c.TLSConfig = config.TLSConfig
		}
	}
	addr := c.Address
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("api: invalid address %q: %w", c.Address, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("api: invalid address %q: scheme must be http or https", c.Address)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("api: invalid address %q: missing host", c.Address)
	}
	if c.HTTPClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if u.Scheme == "https" {
			tc, err := c.TLSConfig.tlsClientConfig()
			if err != nil {
				return nil, err
			}
			tr.TLSClientConfig = tc
		}
		c.HTTPClient = &http.Client{Transport: tr}
	}
	return &Client{config: c, baseURL: u}, nil
}

// Address returns the agent address the client talks to.
func (c *Client) Address() string { return c.baseURL.String() }

// QueryOptions are the parameters of a read.
type QueryOptions struct {
	// Region to ask; empty means the client's region, then the agent's.
	Region string
	// AllowStale lets any server answer from its own state.
	AllowStale bool
	// WaitIndex makes the read a blocking query: it returns once the
	// result's index is past WaitIndex, or after WaitTime.
	WaitIndex uint64
	// WaitTime bounds a blocking query; the server caps it at 10 minutes.
	WaitTime time.Duration
	// Prefix filters lists by ID prefix.
	Prefix string
	// AuthToken is sent as X-Nomad-Token.
	AuthToken string

	ctx context.Context
}

// WithContext returns a copy of q whose requests end when ctx does.
func (q *QueryOptions) WithContext(ctx context.Context) *QueryOptions {
	c := &QueryOptions{}
	if q != nil {
		*c = *q
	}
	c.ctx = ctx
	return c
}

// QueryMeta is what a read's answer says about the data.
type QueryMeta struct {
	// LastIndex is the index the result reflects; pass it as WaitIndex to
	// wait for a change.
	LastIndex uint64
	// LastContact is how long ago the answering server heard from the
	// leader.
	LastContact time.Duration
	// KnownLeader reports whether the answering server knew of a leader.
	KnownLeader bool
	// RequestTime is how long the request took.
	RequestTime time.Duration
}

// WriteOptions are the parameters of a write.
type WriteOptions struct {
	Region    string
	AuthToken string

	ctx context.Context
}

// WithContext returns a copy of w whose requests end when ctx does.
func (w *WriteOptions) WithContext(ctx context.Context) *WriteOptions {
	c := &WriteOptions{}
	if w != nil {
		*c = *w
	}
	c.ctx = ctx
	return c
}

// WriteMeta is what a write's answer says.
type WriteMeta struct {
	// LastIndex is the index of the write, when it made one.
	LastIndex   uint64
	RequestTime time.Duration
}

// UnexpectedResponseError is the error for any answer outside 2xx. Its
// message has the status code and the body, as Nomad's client does.
type UnexpectedResponseError struct {
	statusCode int
	body       string
}

func (e *UnexpectedResponseError) Error() string {
	if e.body == "" {
		return fmt.Sprintf("Unexpected response code: %d", e.statusCode)
	}
	return fmt.Sprintf("Unexpected response code: %d (%s)", e.statusCode, e.body)
}

// StatusCode returns the HTTP status code.
func (e *UnexpectedResponseError) StatusCode() int { return e.statusCode }

// Body returns the response body, trimmed of surrounding space.
func (e *UnexpectedResponseError) Body() string { return e.body }

// maxErrorBody bounds how much of an error response is kept.
const maxErrorBody = 64 << 10

// request is one call in the making.
type request struct {
	method string
	// path is unescaped; building the URL escapes it.
	path   string
	params url.Values
	header http.Header
	body   any
	// rawBody, if set, is sent as is (application/octet-stream) instead
	// of body as JSON.
	rawBody io.Reader
	ctx     context.Context
}

func (c *Client) newRequest(method, path string) *request {
	r := &request{
		method: method,
		path:   path,
		params: url.Values{},
		header: http.Header{},
		ctx:    context.Background(),
	}
	if c.config.Region != "" {
		r.params.Set("region", c.config.Region)
	}
	if c.config.SecretID != "" {
		r.header.Set("X-Nomad-Token", c.config.SecretID)
	}
	return r
}

// SetSecretID sets the ACL token sent with every request.
func (c *Client) SetSecretID(secret string) { c.config.SecretID = secret }

func (c *Client) setQueryOptions(r *request, q *QueryOptions) {
	if q == nil {
		return
	}
	if q.Region != "" {
		r.params.Set("region", q.Region)
	}
	if q.AllowStale {
		r.params.Set("stale", "")
	}
	if q.WaitIndex != 0 {
		r.params.Set("index", strconv.FormatUint(q.WaitIndex, 10))
		wait := q.WaitTime
		if wait == 0 {
			wait = c.config.WaitTime
		}
		if wait != 0 {
			r.params.Set("wait", durationParam(wait))
		}
	} else if q.WaitTime != 0 {
		r.params.Set("wait", durationParam(q.WaitTime))
	}
	if q.Prefix != "" {
		r.params.Set("prefix", q.Prefix)
	}
	if q.AuthToken != "" {
		r.header.Set("X-Nomad-Token", q.AuthToken)
	}
	if q.ctx != nil {
		r.ctx = q.ctx
	}
}

func (c *Client) setWriteOptions(r *request, w *WriteOptions) {
	if w == nil {
		return
	}
	if w.Region != "" {
		r.params.Set("region", w.Region)
	}
	if w.AuthToken != "" {
		r.header.Set("X-Nomad-Token", w.AuthToken)
	}
	if w.ctx != nil {
		r.ctx = w.ctx
	}
}

// durationParam renders d in milliseconds, as Nomad's client does.
func durationParam(d time.Duration) string {
	ms := d.Milliseconds()
	if ms == 0 && d > 0 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

// do sends r and returns the response if its status is 2xx; otherwise the
// body is read into an UnexpectedResponseError. The caller closes the body.
func (c *Client) do(r *request) (*http.Response, time.Duration, error) {
	u := *c.baseURL
	u.Path = strings.TrimSuffix(u.Path, "/") + r.path
	u.RawQuery = r.params.Encode()

	var body io.Reader
	if r.body != nil {
		buf, err := json.Marshal(r.body)
		if err != nil {
			return nil, 0, fmt.Errorf("api: encode request body: %w", err)
		}
		body = bytes.NewReader(buf)
	}
	if r.rawBody != nil {
		body = r.rawBody
	}
	req, err := http.NewRequestWithContext(r.ctx, r.method, u.String(), body)
	if err != nil {
		return nil, 0, fmt.Errorf("api: build request: %w", err)
	}
	req.Header = r.header
	switch {
	case r.rawBody != nil:
		req.Header.Set("Content-Type", "application/octet-stream")
	case body != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.config.HTTPClient.Do(req)
	rtt := time.Since(start)
	if err != nil {
		return nil, rtt, fmt.Errorf("api: %s %s: %w", r.method, r.path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		buf, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, rtt, &UnexpectedResponseError{
			statusCode: resp.StatusCode,
			body:       strings.TrimSpace(string(buf)),
		}
	}
	return resp, rtt, nil
}

// query runs a GET and decodes the JSON answer into out.
func (c *Client) query(path string, out any, q *QueryOptions) (*QueryMeta, error) {
	r := c.newRequest(http.MethodGet, path)
	c.setQueryOptions(r, q)
	resp, rtt, err := c.do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	qm := parseQueryMeta(resp)
	qm.RequestTime = rtt
	if err := decodeBody(resp, out); err != nil {
		return nil, err
	}
	return qm, nil
}

// rawQuery runs a GET and returns the answer's body as is.
func (c *Client) rawQuery(path string, params url.Values, q *QueryOptions) ([]byte, *QueryMeta, error) {
	r := c.newRequest(http.MethodGet, path)
	c.setQueryOptions(r, q)
	for k, v := range params {
		r.params[k] = v
	}
	resp, rtt, err := c.do(r)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	qm := parseQueryMeta(resp)
	qm.RequestTime = rtt
	buf, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("api: read response: %w", err)
	}
	return buf, qm, nil
}

// write runs a PUT, POST or DELETE with params, decoding the JSON answer
// into out unless out is nil.
func (c *Client) write(method, path string, params url.Values, in, out any, w *WriteOptions) (*WriteMeta, error) {
	r := c.newRequest(method, path)
	c.setWriteOptions(r, w)
	for k, v := range params {
		r.params[k] = v
	}
	r.body = in
	resp, rtt, err := c.do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	wm := &WriteMeta{RequestTime: rtt}
	wm.LastIndex, _ = strconv.ParseUint(resp.Header.Get("X-Nomad-Index"), 10, 64)
	if out != nil {
		if err := decodeBody(resp, out); err != nil {
			return nil, err
		}
	}
	return wm, nil
}

// parseQueryMeta reads the index headers; a missing or malformed header
// leaves its field zero.
func parseQueryMeta(resp *http.Response) *QueryMeta {
	h := resp.Header
	qm := &QueryMeta{}
	qm.LastIndex, _ = strconv.ParseUint(h.Get("X-Nomad-Index"), 10, 64)
	if ms, err := strconv.ParseUint(h.Get("X-Nomad-LastContact"), 10, 63); err == nil {
		qm.LastContact = time.Duration(ms) * time.Millisecond
	}
	qm.KnownLeader = h.Get("X-Nomad-KnownLeader") == "true"
	return qm
}

func decodeBody(resp *http.Response, out any) error {
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("api: decode response: %w", err)
	}
	return nil
}
