//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// EnvArtifacts names a directory for test artifacts (screenshots); the
// default is artifacts/ beside the tests, which git ignores.
const EnvArtifacts = "ROAM_ARTIFACTS"

// chromiumPath is where Debian's chromium package puts the browser; CI
// installs it (.ci/run, make test).
const chromiumPath = "/usr/bin/chromium"

// Browser viewport of every browser test and screenshot.
const (
	viewportW = 1280
	viewportH = 800
)

// browser is one headless Chromium, driven over CDP with chromedp, ended
// with the test.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// newBrowser starts headless Chromium for the test. A missing browser
// fails the test naming the package to install: a skipped browser test
// would pass by testing nothing.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	exe := chromiumPath
	if p := os.Getenv("ROAM_CHROMIUM"); p != "" {
		exe = p
	}
	if _, err := exec.LookPath(exe); err != nil {
		t.Fatalf("e2e: no browser at %s (%v): install it with `apt-get install -y chromium`", exe, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.WindowSize(viewportW, viewportH),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox refuses to start
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("force-device-scale-factor", "1"),
	)
	// Chromium now and then fails to start on a loaded machine; a test
	// about the UI should not fail for that, so it gets three tries.
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelCtx := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
		if lastErr = chromedp.Do(ctx, chromedp.EmulateViewport(viewportW, viewportH)); lastErr == nil {
			t.Cleanup(func() {
				cancelCtx()
				cancelAlloc()
			})
			return &browser{t: t, ctx: ctx}
		}
		cancelCtx()
		cancelAlloc()
		t.Logf("e2e: start chromium (try %d of 3): %v", attempt, lastErr)
	}
	t.Fatalf("e2e: start chromium: %v", lastErr)
	return nil
}

// run runs actions, bounded by timeout.
func (b *browser) run(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// mustRun is run that fails the test.
func (b *browser) mustRun(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := b.run(timeout, actions...); err != nil {
		b.t.Fatalf("e2e: browser: %v", err)
	}
}

// navigate loads url and waits for it to load.
func (b *browser) navigate(url string) {
	b.t.Helper()
	b.mustRun(30*time.Second, chromedp.Navigate(url))
}

// evalJS returns the value of a JavaScript expression.
func evalJS[T any](b *browser, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// waitJS polls a JavaScript boolean expression until it holds or timeout
// passes; the error names the expression and the page's text.
func (b *browser) waitJS(timeout time.Duration, expr string) error {
	err := pollEvery(timeout, 100*time.Millisecond, func() error {
		ok, err := evalJS[bool](b, expr)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		text, _ := evalJS[string](b, `document.body ? document.body.innerText.slice(0, 2000) : ""`)
		return fmt.Errorf("waiting for %s: %w\npage text:\n%s", expr, err, text)
	}
	return nil
}

// screenshot saves the viewport as <artifacts>/<name>.png.
func (b *browser) screenshot(name string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("e2e: screenshot %s: %v", name, err)
	}
	dir := os.Getenv(EnvArtifacts)
	if dir == "" {
		dir = "artifacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatalf("e2e: %v", err)
	}
	path := filepath.Join(dir, strings.ReplaceAll(name, "/", "_")+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatalf("e2e: %v", err)
	}
	b.t.Logf("screenshot: %s", path)
	return path
}

// checkLayout fails the test if the page scrolls sideways at the test
// viewport (something is cut off or pushed out) or if any two visible
// cells, headings, links or buttons overlap.
func (b *browser) checkLayout(page string) {
	b.t.Helper()
	problems, err := evalJS[[]string](b, `(function () {
  var out = [];
  if (document.documentElement.scrollWidth > window.innerWidth)
    out.push("page is " + document.documentElement.scrollWidth + " px wide, viewport " + window.innerWidth);
  var els = Array.prototype.slice.call(document.querySelectorAll("header a, header button, header input, header label, h1, h2, th, td, dt, dd, .api a, .live"));
  var boxes = els.map(function (e) { return [e, e.getBoundingClientRect()]; }).filter(function (p) {
    return p[1].width > 0 && p[1].height > 0 && p[1].top < window.innerHeight; });
  for (var i = 0; i < boxes.length && out.length < 10; i++) {
    for (var j = i + 1; j < boxes.length && out.length < 10; j++) {
      var a = boxes[i], c = boxes[j];
      if (a[0].contains(c[0]) || c[0].contains(a[0])) continue;
      var r = a[1], s = c[1];
      var ox = Math.min(r.right, s.right) - Math.max(r.left, s.left);
      var oy = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
      if (ox > 1 && oy > 1) out.push(a[0].tagName + " '" + a[0].textContent.trim().slice(0, 30) + "' overlaps " +
        c[0].tagName + " '" + c[0].textContent.trim().slice(0, 30) + "'");
    }
  }
  return out;
})()`)
	if err != nil {
		b.t.Fatalf("e2e: layout check on %s: %v", page, err)
	}
	if len(problems) > 0 {
		b.t.Fatalf("e2e: layout of %s:\n%s", page, strings.Join(problems, "\n"))
	}
}

// checkA11y fails the test on the accessibility basics the UI promises:
// a page language, a labelled control for every input, text on every
// button, a label on every chart, and the skip link as the first stop of
// the keyboard.
func (b *browser) checkA11y(page string) {
	b.t.Helper()
	problems, err := evalJS[[]string](b, `(function () {
  var out = [];
  if (!document.documentElement.lang) out.push("no lang on <html>");
  document.querySelectorAll("input").forEach(function (i) {
    var labelled = (i.id && document.querySelector('label[for="' + i.id + '"]')) || i.closest("label") || i.getAttribute("aria-label");
    if (!labelled) out.push("input without a label: " + (i.id || i.name || i.outerHTML.slice(0, 60)));
  });
  document.querySelectorAll("button").forEach(function (x) {
    if (!x.textContent.trim() && !x.getAttribute("aria-label")) out.push("button without text");
  });
  document.querySelectorAll("svg").forEach(function (s) {
    if (!s.getAttribute("aria-label")) out.push("chart without a label");
  });
  document.querySelectorAll("th").forEach(function (th) {
    if (th.closest("thead") && !th.getAttribute("scope")) out.push("column header without scope: " + th.textContent);
  });
  return out;
})()`)
	if err != nil {
		b.t.Fatalf("e2e: a11y check on %s: %v", page, err)
	}
	if len(problems) > 0 {
		b.t.Fatalf("e2e: accessibility of %s:\n%s", page, strings.Join(problems, "\n"))
	}
	// The keyboard's first stop is the skip link, and it leads to the
	// content.
	if _, err := evalJS[bool](b, `(document.activeElement && document.activeElement.blur(), window.scrollTo(0, 0), true)`); err != nil {
		b.t.Fatalf("e2e: blur on %s: %v", page, err)
	}
	if err := b.run(5*time.Second, chromedp.KeyEvent("\t")); err != nil {
		b.t.Fatalf("e2e: tab on %s: %v", page, err)
	}
	first, err := evalJS[string](b, `document.activeElement ? document.activeElement.className + ":" + document.activeElement.getAttribute("href") : ""`)
	if err != nil || first != "skip:#content" {
		b.t.Fatalf("e2e: first Tab stop on %s is %q (%v), want the skip link", page, first, err)
	}
	// Leave the page as it was: the focused skip link covers the menu.
	if _, err := evalJS[bool](b, `(document.activeElement && document.activeElement.blur(), true)`); err != nil {
		b.t.Fatalf("e2e: blur on %s: %v", page, err)
	}
}
