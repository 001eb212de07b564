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
  // and "freed" once a claim seen before is gone. While the event stream
  // is open it is built from the volume in each event, which carries every
  // state the servers checkpointed; otherwise from each refreshed page.
  var seen = null;
  var timeline = [];
  var fromEvents = false;
  var volumeID = main.getAttribute("data-volume") || "";
  function stamp() { return new Date().toISOString().slice(11, 23); }
  function observe(claims) {
    var now = {};
    var first = seen === null;
    seen = seen || {};
    for (var i = 0; i < claims.length; i++) {
      var c = claims[i];
      var st = c.state || "freed";
      now[c.alloc] = st;
      if (seen[c.alloc] !== st) {
        timeline.push({ t: stamp(), alloc: c.alloc, node: c.node, mode: c.mode, state: st, initial: first });
      }
    }
    for (var old in seen) {
      if (!(old in now)) {
        if (seen[old] !== "freed") timeline.push({ t: stamp(), alloc: old, state: "freed" });
        now[old] = "freed";
      }
    }
    seen = now;
    drawTimeline();
  }
  function claimsOnPage() {
    var out = [];
    var rows = page.querySelectorAll("tr[data-claim]");
    for (var i = 0; i < rows.length; i++) {
      out.push({ alloc: rows[i].getAttribute("data-claim"), state: rows[i].getAttribute("data-claim-state"),
        node: rows[i].getAttribute("data-claim-node"), mode: rows[i].getAttribute("data-claim-mode") });
    }
    return out;
  }
  function drawTimeline() {
    var list = document.getElementById("claim-timeline");
    if (!list) return;
    list.textContent = "";
    for (var j = 0; j < timeline.length; j++) {
      var e = timeline[j];
      var li = document.createElement("li");
      li.setAttribute("data-alloc", e.alloc);
      li.setAttribute("data-state", e.state);
      li.className = "claim-" + e.state;
      li.textContent = e.t + " UTC — alloc " + e.alloc.slice(0, 8) +
        (e.node ? " on node " + e.node.slice(0, 8) : "") + (e.mode ? " (" + e.mode + ")" : "") +
        " → " + e.state + (e.initial ? " (when the page opened)" : "");
      list.appendChild(li);
    }
  }
  function trackClaims() {
    if (!volumeID) return;
    if (!fromEvents || seen === null) observe(claimsOnPage()); else drawTimeline();
  }
  function onEvents(frame) {
    if (!volumeID || !frame.Events) return;
    for (var i = 0; i < frame.Events.length; i++) {
      var ev = frame.Events[i];
      var v = ev.Payload && ev.Payload.Volume;
      if (ev.Topic !== "CSIVolume" || !v || v.ID !== volumeID) continue;
      var claims = (v.Claims || []).map(function (c) {
        return { alloc: c.AllocationID, state: c.State, node: c.NodeID, mode: c.Mode };
      });
      if (ev.Type === "CSIVolumeDeregistered") claims = [];
      observe(claims);
    }
  }

  var last = 0, timer = null, inflight = false, dirty = false;
  // lastResult is the answer to the operator's last node change, kept
  // across refreshes of the content that shows it.
  var lastResult = "";
  function refresh() {
    var wait = last + MIN_GAP_MS - Date.now();
    if (inflight) { dirty = true; return; }
    // Never swap the content under an operator who is typing in it.
    var active = document.activeElement;
    if (active && active !== page && page.contains(active) && active.tagName === "INPUT") {
      wait = Math.max(wait, MIN_GAP_MS);
    }
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
      loadLogs();
      var out = document.getElementById("drain-result");
      if (out && lastResult) out.textContent = lastResult;
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
      fromEvents = true;
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
            if (!line || line === "{}") continue;
            try { onEvents(JSON.parse(line)); } catch (e) { /* a partial or odd line: the refresh still shows the truth */ }
            refresh();
          }
          return pump();
        });
      }
      return pump();
    }).catch(function (err) {
      fromEvents = false;
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

  // The drain button (node page). The form is re-rendered on refresh, so
  // listen on the page. Deadline: a Go duration (30s, 10m, 1h, 1h30m).
  function parseDuration(text) {
    var re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g, m, total = 0, used = 0;
    var unit = { ms: 1e6, s: 1e9, m: 60e9, h: 3600e9 };
    text = text.trim();
    while ((m = re.exec(text)) !== null) { total += parseFloat(m[1]) * unit[m[2]]; used += m[0].length; }
    if (!text || used !== text.length || total <= 0) return null;
    return Math.round(total);
  }
  // nodeWrite sends a drain or eligibility change and reports the answer
  // in the form; a refusal for want of a token disables the buttons.
  function nodeWrite(path, body, done) {
    var out = { set textContent(v) { lastResult = v; var el = document.getElementById("drain-result"); if (el) el.textContent = v; } };
    var btns = document.querySelectorAll("#drain-form button");
    function enable(on) { for (var i = 0; i < btns.length; i++) btns[i].disabled = !on; }
    enable(false);
    out.textContent = "Sending…";
    var h = headers();
    h["Content-Type"] = "application/json";
    fetch(path, { method: "PUT", headers: h, body: JSON.stringify(body) }).then(function (resp) {
      return resp.text().then(function (text) {
        if (resp.status === 401 || resp.status === 403) {
          out.textContent = "Not allowed: your token cannot change nodes (node write needed).";
          return;
        }
        enable(true);
        if (!resp.ok) { out.textContent = "Failed (" + resp.status + "): " + text; return; }
        out.textContent = done;
        refresh();
      });
    }).catch(function (err) { enable(true); out.textContent = "Failed: " + err; });
  }
  page.addEventListener("submit", function (ev) {
    var f = ev.target;
    if (!f || f.id !== "drain-form") return;
    ev.preventDefault();
    var node = f.getAttribute("data-node");
    var btn = document.getElementById("drain-button");
    var body = { NodeID: node, DrainSpec: null, MarkEligible: false };
    if (btn.getAttribute("data-action") === "start") {
      var d = parseDuration(document.getElementById("drain-deadline").value);
      if (d === null) {
        lastResult = "Invalid deadline: use a duration such as 30s, 10m or 1h.";
        document.getElementById("drain-result").textContent = lastResult;
        return;
      }
      body.DrainSpec = { Deadline: d, IgnoreSystemJobs: document.getElementById("drain-ignore-system").checked };
    } else {
      body.MarkEligible = true;
    }
    nodeWrite("/v1/node/" + encodeURIComponent(node) + "/drain", body, body.DrainSpec ? "Drain started." : "Drain stopped.");
  });
  page.addEventListener("click", function (ev) {
    var b = ev.target;
    if (!b || b.id !== "eligible-button") return;
    var node = document.getElementById("drain-form").getAttribute("data-node");
    nodeWrite("/v1/node/" + encodeURIComponent(node) + "/eligibility",
      { NodeID: node, Eligibility: "eligible" }, "Marked eligible.");
  });

  // Log tails (allocation page): read with the token, as text, into the
  // <pre>; a log that is not there yet says so.
  function loadLogs() {
    var pres = page.querySelectorAll("pre[data-log]");
    Array.prototype.forEach.call(pres, function (pre) {
      fetch(pre.getAttribute("data-log"), { headers: headers(), cache: "no-store" }).then(function (resp) {
        return resp.text().then(function (text) {
          pre.textContent = resp.ok ? (text || "(empty)") : "log unavailable (" + resp.status + "): " + text;
        });
      }).catch(function (err) { pre.textContent = "log unavailable: " + err; });
    });
  }

  loadLogs();
  trackClaims();
  var status = main.getAttribute("data-status");
  // The first paint came without a token (a browser cannot send headers
  // on navigation); with one in storage, fetch the content with it.
  if ((status === "401" || status === "403") && token()) refresh();
  follow();
})();
