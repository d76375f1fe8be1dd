// floom's web UI works without this file; with it, times show in the viewer's timezone,
// a running run's log streams in live, and destructive buttons ask first.
(function () {
  "use strict";

  var dateTime = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
  });
  var timeOnly = new Intl.DateTimeFormat(undefined, {
    hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false
  });

  // <time datetime="...Z" title="... UTC">: show local time, keep UTC in the tooltip.
  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.local) { return; }
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when.getTime())) { return; }
      el.textContent = (el.dataset.format === "time" ? timeOnly : dateTime).format(when);
      el.dataset.local = "1";
    });
  }

  function confirmations() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
        event.preventDefault();
      }
    });
  }

  function utcText(d) {
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "") + " UTC";
  }

  function logLine(e) {
    var li = document.createElement("li");
    li.dataset.seq = String(e.seq);
    li.className = "stream-" + e.stream;
    var ts = new Date(String(e.ts).replace(" ", "T"));
    var time = document.createElement("time");
    if (!isNaN(ts.getTime())) {
      time.setAttribute("datetime", ts.toISOString());
      time.title = utcText(ts);
      time.dataset.format = "time";
      time.textContent = timeOnly.format(ts);
      time.dataset.local = "1";
    }
    var stream = document.createElement("span");
    stream.className = "stream";
    stream.textContent = e.stream;
    var text = document.createElement("span");
    text.className = "line";
    text.textContent = e.line;  // text, never HTML: log lines come from the worker
    li.append(time, stream, text);
    return li;
  }

  // Swap the parts of the run page that change as the run moves on, keeping the log.
  var refreshing = false;
  function refreshRun() {
    if (refreshing) { return; }
    refreshing = true;
    fetch(window.location.pathname, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        ["run-head", "run-summary", "run-actions", "run-lineage", "run-results",
          "tool-calls", "approvals"].forEach(function (id) {
          var mine = document.getElementById(id);
          var fresh = doc.getElementById(id);
          if (mine && fresh && !mine.contains(document.activeElement)) {
            mine.replaceWith(document.adoptNode(fresh));
          }
        });
        localTimes(document);
      })
      .catch(function () { /* the page still shows the log; a reload shows the rest */ })
      .then(function () { refreshing = false; });
  }

  function liveLog() {
    var log = document.getElementById("log");
    if (!log || log.dataset.terminal === "true" || !window.EventSource) { return; }
    var last = parseInt(log.dataset.lastSeq || "0", 10);
    var status = document.getElementById("log-status");
    var source = new EventSource(log.dataset.stream + "?after=" + last);
    status.textContent = "Live: new lines appear as the run writes them.";
    source.addEventListener("log", function (message) {
      var e = JSON.parse(message.data);
      // A reconnect resumes after the last id the browser saw; never show a line twice.
      if (e.seq <= last) { return; }
      last = e.seq;
      log.dataset.lastSeq = String(last);
      var empty = log.querySelector(".log-empty");
      if (empty) { empty.remove(); }
      var atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      log.appendChild(logLine(e));
      if (atBottom) { log.lastChild.scrollIntoView({ block: "end" }); }
      // floom's own notices mark changes of state (started, awaiting approval, retrying).
      if (e.stream === "system") { refreshRun(); }
    });
    // The run's status as the stream sees it: a page opened while the run was queued
    // shows it running as soon as it starts, even before a line says so.
    source.addEventListener("status", function (message) {
      var now = JSON.parse(message.data).status;
      var shown = document.querySelector("#run-status .badge");
      if (shown && !shown.classList.contains("badge-" + now)) { refreshRun(); }
    });
    source.addEventListener("end", function () {
      source.close();
      log.dataset.terminal = "true";
      status.textContent = "The run has ended.";
      refreshRun();
    });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) {
        status.textContent = "Live updates stopped; reload the page to see new lines.";
      }
    });
  }

  function start() {
    localTimes(document);
    confirmations();
    liveLog();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
