// Paddock console: live updates. Served from the binary as /ui/assets/console.js.
//
// The page says what it shows in attributes the server escaped: <body data-live="list"> (any
// node change matters) or data-live="node" with data-subjects="<uuid> mac-<hex> …" (changes to
// these subjects matter). On such a change the page is fetched again and every element with
// a data-live-region attribute is replaced by its fresh copy, parsed by the browser from the
// server's own (escaped) HTML. Nothing here builds HTML from strings.
(function () {
  "use strict";
  var body = document.body;
  var live = body.getAttribute("data-live");
  if (!live || !window.EventSource || !window.fetch || !window.DOMParser) {
    return;
  }
  var subjects = (body.getAttribute("data-subjects") || "").split(" ").filter(Boolean);
  var status = document.getElementById("live-status");
  var timer = null;
  var busy = false;
  var again = false;

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function swap(text) {
    var fresh = new DOMParser().parseFromString(text, "text/html");
    var regions = document.querySelectorAll("[data-live-region]");
    for (var i = 0; i < regions.length; i++) {
      var old = regions[i];
      var id = old.getAttribute("data-live-region");
      var next = fresh.querySelector('[data-live-region="' + CSS.escape(id) + '"]');
      if (next) {
        old.replaceWith(document.adoptNode(next));
      }
    }
    var title = fresh.querySelector("title");
    if (title) {
      document.title = title.textContent;
    }
  }

  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(window.location.href, { headers: { Accept: "text/html" }, cache: "no-store" })
      .then(function (r) {
        return r.text();
      })
      .then(swap)
      .catch(function () {
        say("update failed; retrying");
      })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          schedule();
        }
      });
  }

  // Bursts (an enrolment writes several keys) become one fetch.
  function schedule() {
    if (timer === null) {
      timer = window.setTimeout(function () {
        timer = null;
        refresh();
      }, 150);
    }
  }

  function concerns(e) {
    if (live === "list") {
      return true;
    }
    var d;
    try {
      d = JSON.parse(e.data);
    } catch (_) {
      return false;
    }
    return subjects.indexOf(d.subject) >= 0;
  }

  var source = new EventSource("/ui/events");
  source.onopen = function () {
    say("live");
  };
  source.onerror = function () {
    say("reconnecting…");
  };
  ["node", "timeline"].forEach(function (name) {
    source.addEventListener(name, function (e) {
      if (name === "timeline" && live === "list") {
        return;
      }
      if (concerns(e)) {
        schedule();
      }
    });
  });
  source.addEventListener("resync", schedule);
})();
