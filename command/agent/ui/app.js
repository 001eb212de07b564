// Roam UI: keeps the ACL token in session storage, sends it as
// X-Nomad-Token, and refreshes the page content without a reload when
// the event stream reports a change to what the page shows (or once a
// second on pages no event describes). Nothing refreshes faster than once
// a second.
"use strict";
(function () {
  var TOKEN_KEY = "roam.token";
  var MIN_GAP_MS = 1000;
  var main = document.getElementById("content");
  var page = document.getElementById("page");
  var live = document.getElementById("live");
  var form = document.getElementById("token-form");
  var input = document.getElementById("token");
  if (!main || !page) return;

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }
  function headers() {
    var h = {};
    var t = token();
    if (t) h["X-Nomad-Token"] = t;
    return h;
  }
  function setLive(text) { if (live) live.textContent = text; }

  // The claim timeline (volume page): every state each claim was seen in,
  // and "freed" once a claim seen before is gone.
  var seen = {};
  var timeline = [];
  function stamp() { return new Date().toISOString().slice(11, 23); }
  function trackClaims() {
    var list = document.getElementById("claim-timeline");
    if (!list) return;
    var now = {};
    var rows = page.querySelectorAll("tr[data-claim]");
    for (var i = 0; i < rows.length; i++) {
      var id = rows[i].getAttribute("data-claim");
      var st = rows[i].getAttribute("data-claim-state") || "freed";
      now[id] = st;
      if (seen[id] !== st) {
        timeline.push({ t: stamp(), alloc: id, node: rows[i].getAttribute("data-claim-node"),
          mode: rows[i].getAttribute("data-claim-mode"), state: st });
      }
    }
    for (var old in seen) {
      if (!(old in now) && seen[old] !== "freed") {
        timeline.push({ t: stamp(), alloc: old, state: "freed" });
        now[old] = "freed";
      } else if (!(old in now)) {
        now[old] = "freed";
      }
    }
    seen = now;
    list.textContent = "";
    for (var j = 0; j < timeline.length; j++) {
      var e = timeline[j];
      var li = document.createElement("li");
      li.setAttribute("data-alloc", e.alloc);
      li.setAttribute("data-state", e.state);
      li.className = "claim-" + e.state;
      li.textContent = e.t + " UTC — alloc " + e.alloc.slice(0, 8) +
        (e.node ? " on node " + e.node.slice(0, 8) : "") + (e.mode ? " (" + e.mode + ")" : "") +
        " → " + e.state;
      list.appendChild(li);
    }
  }

  var last = 0, timer = null, inflight = false, dirty = false;
  function refresh() {
    var wait = last + MIN_GAP_MS - Date.now();
    if (inflight) { dirty = true; return; }
    if (wait > 0) {
      if (!timer) timer = setTimeout(function () { timer = null; refresh(); }, wait);
      return;
    }
    inflight = true;
    dirty = false;
    last = Date.now();
    var u = new URL(location.href);
    u.searchParams.set("fragment", "1");
    fetch(u.toString(), { headers: headers(), cache: "no-store" }).then(function (resp) {
      main.setAttribute("data-status", String(resp.status));
      return resp.text();
    }).then(function (html) {
      page.innerHTML = html;
      trackClaims();
    }).catch(function (err) {
      setLive("live: update failed (" + err + "), retrying");
    }).then(function () {
      inflight = false;
      if (dirty) refresh();
    });
  }

  // Follow the event stream for the page's topics; on any event, refresh.
  // Where there is no stream (a client-only agent) or it drops, fall back
  // to a refresh once a second until it can be opened again.
  var topics = (main.getAttribute("data-topics") || "").split(" ").filter(Boolean);
  var ticking = null;
  function tick(on) {
    if (on && !ticking) ticking = setInterval(refresh, MIN_GAP_MS);
    if (!on && ticking) { clearInterval(ticking); ticking = null; }
  }
  function follow() {
    if (!topics.length || !window.fetch || !window.TextDecoder) { tick(true); return; }
    var q = topics.map(function (t) { return "topic=" + encodeURIComponent(t); }).join("&");
    var ctl = new AbortController();
    fetch("/v1/event/stream?" + q, { headers: headers(), signal: ctl.signal }).then(function (resp) {
      if (!resp.ok || !resp.body) throw new Error("event stream answered " + resp.status);
      tick(false);
      setLive("live: event stream");
      // Catch up on anything that changed before the stream opened.
      refresh();
      var reader = resp.body.getReader();
      var dec = new TextDecoder();
      var buf = "";
      function pump() {
        return reader.read().then(function (r) {
          if (r.done) throw new Error("event stream ended");
          buf += dec.decode(r.value, { stream: true });
          var nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            var line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (line && line !== "{}") refresh();
          }
          return pump();
        });
      }
      return pump();
    }).catch(function (err) {
      setLive("live: refresh every 1 s (" + err.message + ")");
      tick(true);
      setTimeout(follow, 5000);
    });
  }

  if (form && input) {
    input.value = token();
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      try { sessionStorage.setItem(TOKEN_KEY, input.value.trim()); } catch (e) { /* storage off */ }
      location.reload();
    });
    var clear = document.getElementById("token-clear");
    if (clear) clear.addEventListener("click", function () {
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* storage off */ }
      location.reload();
    });
  }

  trackClaims();
  var status = main.getAttribute("data-status");
  // The first paint came without a token (a browser cannot send headers
  // on navigation); with one in storage, fetch the content with it.
  if ((status === "401" || status === "403") && token()) refresh();
  follow();
})();
