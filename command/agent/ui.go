package agent

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// The web UI: server-rendered HTML pages under /ui/, with a little
// JavaScript (ui/app.js) that swaps in fresh page content when the event
// stream says something changed. Every page is built from the same
// handlers the v1 API answers with, called with the browser's request
// headers (its X-Nomad-Token among them), and names the API URL it uses.

//go:embed ui
var uiFiles embed.FS

// uiPathPrefix is where the UI lives; "/" redirects here.
const uiPathPrefix = "/ui/"

// uiAssetPrefix serves the embedded stylesheet and script.
const uiAssetPrefix = "/ui/assets/"

// maxUIPathLen bounds a UI path; every real one is far shorter.
const maxUIPathLen = 512

// uiPage is one page: its title, the topics of the event stream it
// refreshes on (empty: it refreshes once a second), the API URLs it reads,
// and the function that renders its content.
type uiPage struct {
	Title string
	// Volume is the volume a volume page shows, for its claim timeline.
	Volume string
	Topics []string
	APIs   []string
	render func(r *http.Request) (template.HTML, error)
}

// uiAssets are the embedded static files by name.
var uiAssets = func() fs.FS {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embed directive guarantees the directory
	}
	return sub
}()

// uiShell is the page around every page's content.
var uiShell = template.Must(template.New("shell").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}} · Roam</title>
<link rel="stylesheet" href="/ui/assets/style.css">
<script src="/ui/assets/app.js" defer></script>
</head>
<body>
<a class="skip" href="#content">Skip to content</a>
<header>
<nav aria-label="Main">
<span class="brand">Roam</span>
<ul>
{{range .Nav}}<li><a href="{{.Href}}"{{if .Current}} aria-current="page"{{end}}>{{.Name}}</a></li>
{{end}}</ul>
</nav>
<form id="token-form" class="token" autocomplete="off">
<label for="token">ACL token</label>
<input id="token" name="token" type="password" spellcheck="false" placeholder="X-Nomad-Token">
<button type="submit">Set</button>
<button type="button" id="token-clear">Clear</button>
</form>
</header>
<main id="content" tabindex="-1" data-topics="{{.Topics}}" data-status="{{.Status}}"{{if .Volume}} data-volume="{{.Volume}}"{{end}}>
<h1>{{.Title}}</h1>
<p class="api"><span>API:</span> {{range .APIs}}<a href="{{.}}"><code>{{.}}</code></a> {{end}}
<span id="live" class="live" role="status" aria-live="polite">{{if .Topics}}live: event stream{{else}}live: refresh every 1 s{{end}}</span></p>
<div id="page">{{.Body}}</div>
</main>
</body>
</html>
`))

// uiNavItem is one link of the menu.
type uiNavItem struct {
	Name, Href string
	Current    bool
}

// uiNav lists the top-level pages.
var uiNav = []uiNavItem{
	{Name: "Cluster", Href: "/ui/cluster"},
	{Name: "Volumes", Href: "/ui/volumes"},
	{Name: "Plugins", Href: "/ui/plugins"},
	{Name: "Jobs", Href: "/ui/jobs"},
}

// serveUI answers everything under /ui/, and "/" with a redirect there.
// Only GET and HEAD; a page that is not there is a 404 page.
func (s *HTTPServer) serveUI(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.writeError(w, &codedError{code: http.StatusMethodNotAllowed, msg: "Invalid method " + r.Method})
		return
	}
	p := r.URL.Path
	if len(r.URL.EscapedPath()) > maxUIPathLen {
		s.writeError(w, badRequest("Invalid UI path: longer than %d bytes", maxUIPathLen))
		return
	}
	if p == "/" || p == "/ui" || p == uiPathPrefix {
		http.Redirect(w, r, "/ui/cluster", http.StatusFound)
		return
	}
	if name, ok := strings.CutPrefix(p, uiAssetPrefix); ok {
		s.serveUIAsset(w, r, name)
		return
	}
	page, current, err := s.uiRoute(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	w.Header().Set("Content-Security-Policy",
		"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	body, err := page.render(r)
	status := http.StatusOK
	if err != nil {
		status, body = uiErrorBody(err)
	}
	if r.URL.Query().Has("fragment") {
		// The script asks for the content alone when it refreshes.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
		return
	}
	nav := make([]uiNavItem, len(uiNav))
	copy(nav, uiNav)
	for i := range nav {
		nav[i].Current = nav[i].Href == current
	}
	var buf bytes.Buffer
	err = uiShell.Execute(&buf, map[string]any{
		"Title": page.Title, "Nav": nav, "APIs": page.APIs, "Body": body,
		"Topics": strings.Join(page.Topics, " "), "Status": status, "Volume": page.Volume,
	})
	if err != nil {
		s.writeError(w, fmt.Errorf("render ui page: %w", err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// uiErrorBody renders an error in place of a page's content. A 401 or 403
// is the "token required" state the script knows to offer the token
// field for.
func uiErrorBody(err error) (int, template.HTML) {
	code, msg := errorStatus(err)
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		return code, template.HTML(`<div class="notice denied" role="alert" id="token-required"><strong>Token required.</strong> ` +
			`The cluster refused this page without a valid ACL token (` + template.HTMLEscapeString(msg) +
			`). Enter a token above; it is kept in this tab's session storage only.</div>`)
	}
	return code, template.HTML(`<div class="notice error" role="alert"><strong>Error ` +
		fmt.Sprint(code) + `:</strong> ` + template.HTMLEscapeString(msg) + `</div>`)
}

// serveUIAsset serves one embedded file by its base name; nothing else
// is reachable.
func (s *HTTPServer) serveUIAsset(w http.ResponseWriter, r *http.Request, name string) {
	if name == "" || strings.ContainsAny(name, "/\\") || name != path.Clean(name) || strings.HasPrefix(name, ".") {
		s.writeError(w, &codedError{code: http.StatusNotFound, msg: "no such UI asset " + fmt.Sprintf("%q", name)})
		return
	}
	data, err := fs.ReadFile(uiAssets, name)
	if err != nil {
		s.writeError(w, &codedError{code: http.StatusNotFound, msg: "no such UI asset " + fmt.Sprintf("%q", name)})
		return
	}
	switch path.Ext(name) {
	case ".css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	case ".js":
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(data)
}

// uiRoute finds the page for r's path and the menu entry it belongs to.
func (s *HTTPServer) uiRoute(r *http.Request) (*uiPage, string, error) {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), uiPathPrefix)
	kind, rawID, hasID := strings.Cut(rest, "/")
	var id string
	if hasID {
		var err error
		if id, err = url.PathUnescape(rawID); err != nil || id == "" {
			return nil, "", badRequest("Invalid ID %q in the UI path", rawID)
		}
	}
	notFound := &codedError{code: http.StatusNotFound, msg: "no UI page at " + fmt.Sprintf("%q", r.URL.Path)}
	switch {
	case kind == "cluster" && !hasID:
		return s.uiClusterPage(), "/ui/cluster", nil
	case kind == "volumes" && !hasID:
		return s.uiVolumesPage(), "/ui/volumes", nil
	case kind == "volume" && hasID:
		if err := checkPathID(csiVolumePathPrefix + url.PathEscape(id)); err != nil {
			return nil, "", err
		}
		return s.uiVolumePage(id), "/ui/volumes", nil
	case kind == "node" && hasID:
		if err := checkPathID(nodePathPrefix + url.PathEscape(id)); err != nil {
			return nil, "", err
		}
		return s.uiNodePage(id), "/ui/cluster", nil
	case kind == "jobs" && !hasID:
		return s.uiJobsPage(), "/ui/jobs", nil
	case kind == "job" && hasID:
		if err := checkPathID(jobPathPrefix + url.PathEscape(id)); err != nil {
			return nil, "", err
		}
		return s.uiJobPage(id), "/ui/jobs", nil
	case kind == "alloc" && hasID:
		if err := checkPathID(allocPathPrefix + url.PathEscape(id)); err != nil {
			return nil, "", err
		}
		return s.uiAllocPage(id), "/ui/jobs", nil
	case kind == "plugins" && !hasID:
		return s.uiPluginsPage(), "/ui/plugins", nil
	}
	return nil, "", notFound
}

// uiCall runs an API handler for the UI as if the browser had asked
// apiURL itself, with its headers (and so its token), and returns the
// object the API would answer with.
func (s *HTTPServer) uiCall(r *http.Request, h handlerFunc, apiURL string) (any, error) {
	u, err := url.Parse(apiURL)
	if err != nil {
		return nil, fmt.Errorf("ui api url %q: %w", apiURL, err)
	}
	sub := r.Clone(r.Context())
	sub.Method = http.MethodGet
	sub.URL = u
	sub.RequestURI = u.RequestURI()
	sub.Body = http.NoBody
	// The page asks what the API route would: the same ACL check first.
	route, _ := s.match(u.EscapedPath())
	if err := s.authorizeHTTP(sub, route); err != nil {
		return nil, err
	}
	rec := &uiDiscardWriter{header: http.Header{}}
	obj, err := h(rec, sub)
	if err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("ui: api handler wrote its own response")
	}
	return obj, nil
}

// uiAllows reports whether the browser's token may call method on the
// API path apiPath, so that a page can disable what it would refuse.
func (s *HTTPServer) uiAllows(r *http.Request, method, apiPath string) bool {
	u, err := url.Parse(apiPath)
	if err != nil {
		return false
	}
	sub := r.Clone(r.Context())
	sub.Method = method
	sub.URL = u
	route, _ := s.match(u.EscapedPath())
	return s.authorizeHTTP(sub, route) == nil
}

// uiDiscardWriter takes the index headers an API handler sets and drops
// them; a UI page answers with its own.
type uiDiscardWriter struct{ header http.Header }

func (d *uiDiscardWriter) Header() http.Header         { return d.header }
func (d *uiDiscardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *uiDiscardWriter) WriteHeader(int)             {}
