// agentledger console: progressive enhancement only. Every page works without it;
// with it, lists and runs update live over server-sent events and expiries count down.
(function () {
  "use strict";

  function fetchHtml(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.text(); });
  }

  // Later calls within `ms` run once, after the last.
  function debounce(fn, ms) {
    var t = null;
    return function () { clearTimeout(t); t = setTimeout(fn, ms); };
  }

  function countdowns(root) {
    var els = (root || document).querySelectorAll("time.countdown");
    els.forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) { return; }
      var left = Math.round((at - Date.now()) / 1000);
      var text;
      if (left <= 0) { text = "now (expired)"; }
      else if (left < 120) { text = "in " + left + " s"; }
      else if (left < 7200) { text = "in " + Math.round(left / 60) + " min"; }
      else { text = "in " + Math.round(left / 3600) + " h"; }
      if (!el.dataset.when) { el.dataset.when = el.textContent; }
      el.textContent = text + " (" + el.dataset.when + ")";
    });
  }

  // The runs list: the server follows the tenant's events and sends the page's rows
  // when one could have changed them (no polling here); the frames' ids let a
  // reconnect say where it was.
  function liveList() {
    var table = document.querySelector("table.runs[data-live]");
    if (!table || !window.EventSource) { return; }
    var body = document.getElementById("run-rows");
    var note = document.getElementById("live-note");
    var shown = null;
    var source = new EventSource(table.dataset.live);
    source.addEventListener("rows", function (e) {
      var html;
      try { html = JSON.parse(e.data).html; } catch (err) { return; }
      if (html !== shown) {
        shown = html;
        body.innerHTML = html;
      }
      if (note) { note.textContent = "Updated " + new Date().toLocaleTimeString(); }
    });
  }

  function liveRun() {
    var box = document.getElementById("story");
    if (!box || !window.EventSource || box.dataset.terminal === "yes") { return; }
    var url = box.dataset.events + "?after=" + encodeURIComponent(box.dataset.after);
    // EventSource sends Last-Event-ID itself when it reconnects: nothing is missed.
    var source = new EventSource(url);
    var refresh = debounce(function () {
      fetchHtml(box.dataset.story).then(function (html) {
        var open = Array.prototype.map.call(box.querySelectorAll("details[open]"), function (d) { return d.id; });
        box.innerHTML = html;
        open.forEach(function (id) { var d = id && document.getElementById(id); if (d) { d.open = true; } });
        countdowns(box);
      }).catch(function () {});
    }, 100);
    source.onmessage = refresh;
    ["run.completed", "run.failed", "run.cancelled", "run.handover", "run.expired"].forEach(function (t) {
      source.addEventListener(t, function () { refresh(); source.close(); });
    });
    source.addEventListener("error", function () { if (source.readyState === 2) { refresh(); } });
    // Every named event of the stream (step.*, run.*, approval.*) refreshes the story.
    var origAdd = function (type) { source.addEventListener(type, refresh); };
    ["run.claimed", "run.parked", "run.released", "run.resumed", "run.cancel_requested", "run.compensating",
     "approval.requested", "approval.decided", "approval.decision_context",
     "step.started", "step.succeeded", "step.failed", "step.unknown", "step.retrying", "step.waiting",
     "step.settled"].forEach(origAdd);
  }

  document.addEventListener("DOMContentLoaded", function () {
    countdowns(document);
    setInterval(function () { countdowns(document); }, 1000);
    liveList();
    liveRun();
  });
})();
