// The console's only script: it keeps the live part of a page current
// (server-sent events, or polling when those fail) and counts the leases
// down between updates. Pages work without it: they then reload every 5 s.
(function () {
  "use strict";
  var box = document.getElementById("live");
  var status = document.getElementById("status");
  var shownAt = performance.now();

  function say(text, cls) {
    if (status) {
      status.textContent = text;
      status.className = "status " + (cls || "");
    }
  }

  function fmt(ms) {
    var s = Math.abs(ms) / 1000;
    var t = s < 60 ? s.toFixed(1) + "s" : Math.floor(s / 60) + "m" + Math.round(s % 60) + "s";
    return ms > 0 ? t + " left" : "expired " + t + " ago";
  }

  // Leases count down from the time left at the last update.
  function countdown() {
    var gone = performance.now() - shownAt;
    var els = document.querySelectorAll("[data-left-ms]");
    for (var i = 0; i < els.length; i++) {
      var left = Number(els[i].getAttribute("data-left-ms")) - gone;
      if (els[i].tagName === "METER") {
        els[i].value = Math.max(left, 0);
      } else {
        els[i].textContent = fmt(left);
      }
    }
  }

  // A tile whose generation moved flashes once, even between two updates
  // that both show it lit.
  function flash(before) {
    var tiles = box.querySelectorAll(".tile[data-generation]");
    for (var i = 0; i < tiles.length; i++) {
      var was = before[tiles[i].id];
      if (was !== undefined && was !== tiles[i].getAttribute("data-generation")) {
        tiles[i].classList.add("flash");
      }
    }
  }

  function show(html) {
    var before = {};
    var tiles = box.querySelectorAll(".tile[data-generation]");
    for (var i = 0; i < tiles.length; i++) {
      before[tiles[i].id] = tiles[i].getAttribute("data-generation");
    }
    // The HTML is drawn by the console's templates, which escape every
    // value; the page's policy runs no script but this one.
    box.innerHTML = html;
    shownAt = performance.now();
    flash(before);
    countdown();
  }

  setInterval(countdown, 200);
  if (!box) {
    return;
  }
  var query = box.getAttribute("data-query");
  var path = box.getAttribute("data-view") + (query ? "?" + query : "");
  var polling = null;

  function poll() {
    fetch("/frag/" + path, { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error(r.status);
        }
        return r.text();
      })
      .then(function (html) {
        show(html);
        say("polling", "polling");
      })
      .catch(function () {
        say("console unreachable", "offline");
      });
  }

  function startPolling() {
    if (polling === null) {
      polling = setInterval(poll, 2000);
      poll();
    }
  }

  if (!window.EventSource) {
    startPolling();
    return;
  }
  var es = new EventSource("/live/" + path);
  var failures = 0;
  es.addEventListener("fragment", function (e) {
    failures = 0;
    show(e.data);
    say("live", "live");
  });
  es.onerror = function () {
    failures++;
    if (failures >= 3) {
      es.close();
      startPolling();
    } else {
      say("reconnecting", "offline");
    }
  };
})();
