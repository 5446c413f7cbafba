// Paddock console: live updates and image upload. Served from the binary as
// /ui/assets/console.js.
//
// The page says what it shows in attributes the server escaped: <body data-live="list"> (any
// node change matters), data-live="node" with data-subjects="<uuid> mac-<hex> …" (changes to
// these subjects matter, power records included), data-live="images" or "leases" (image or
// DHCP lease changes matter). On such a change, and every data-live-poll ms while a region
// carries that attribute, the page is fetched again and every element with a
// data-live-region attribute is replaced by its fresh copy, parsed by the browser from the
// server's own (escaped) HTML. Nothing here builds HTML from strings; messages are set as
// text.
(function () {
  "use strict";
  var body = document.body;
  var live = body.getAttribute("data-live");
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

  // The machines picked for a bulk action stay picked when the list is read again.
  function picked() {
    var out = {};
    var boxes = document.querySelectorAll('input[name="node"]:checked');
    for (var i = 0; i < boxes.length; i++) {
      out[boxes[i].value] = true;
    }
    return out;
  }

  function swap(text) {
    var keep = picked();
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
    var boxes = document.querySelectorAll('input[name="node"]');
    for (var j = 0; j < boxes.length; j++) {
      boxes[j].checked = keep[boxes[j].value] === true;
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

  // Whether a change event concerns this page.
  function concerns(name, e) {
    if (live === "images" || name === "image") {
      return live === "images" && name === "image";
    }
    if (live === "leases" || name === "lease") {
      return live === "leases" && name === "lease";
    }
    if (live === "list") {
      return name === "node";
    }
    var d;
    try {
      d = JSON.parse(e.data);
    } catch (_) {
      return false;
    }
    return subjects.indexOf(d.subject) >= 0;
  }

  // The upload form: the tarball as the request's body, its progress on the bar.
  function upload(form) {
    var bar = document.getElementById("upload-progress");
    var said = document.getElementById("upload-status");
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var file = form.elements.tarball.files[0];
      var name = form.elements.name.value;
      if (!file || !name) {
        return;
      }
      var xhr = new XMLHttpRequest();
      xhr.open("POST", "/ui/images?name=" + encodeURIComponent(name));
      xhr.setRequestHeader("Content-Type", "application/x-tar");
      bar.hidden = false;
      bar.value = 0;
      said.textContent = "uploading " + file.name + "…";
      xhr.upload.onprogress = function (p) {
        if (p.lengthComputable) {
          bar.value = Math.round((100 * p.loaded) / p.total);
        }
      };
      xhr.onload = function () {
        var answer = {};
        try {
          answer = JSON.parse(xhr.responseText);
        } catch (_) {
          answer = {};
        }
        if (xhr.status === 200) {
          bar.value = 100;
          said.textContent = "added " + answer.name + " (" + answer.members + " members)";
          form.reset();
          refresh();
        } else {
          said.textContent =
            (answer.error && answer.error.message) || "upload failed: HTTP " + xhr.status;
        }
      };
      xhr.onerror = function () {
        said.textContent = "upload failed: the connection was lost";
      };
      xhr.send(file);
    });
  }

  // "Select every machine on this page": the header's checkbox ticks the rows' boxes.
  document.addEventListener("change", function (e) {
    if (e.target.hasAttribute && e.target.hasAttribute("data-select-all")) {
      var boxes = document.querySelectorAll('input[name="node"]');
      for (var i = 0; i < boxes.length; i++) {
        boxes[i].checked = e.target.checked;
      }
    }
  });

  var form = document.querySelector("form[data-upload]");
  if (form && window.XMLHttpRequest) {
    upload(form);
  }
  if (!live || !window.EventSource || !window.fetch || !window.DOMParser) {
    return;
  }
  var source = new EventSource("/ui/events");
  source.onopen = function () {
    say("live");
  };
  source.onerror = function () {
    say("reconnecting…");
  };
  ["node", "timeline", "power", "image", "lease"].forEach(function (name) {
    source.addEventListener(name, function (e) {
      if (concerns(name, e)) {
        schedule();
      }
    });
  });
  source.addEventListener("resync", schedule);
  // A region that shows what the store does not hold (a fetch's bytes, in the dominator's
  // memory) asks to be read again every data-live-poll ms while the page shows it.
  function poll() {
    var region = document.querySelector("[data-live-poll]");
    var every = region ? parseInt(region.getAttribute("data-live-poll"), 10) : 0;
    window.setTimeout(function () {
      if (every > 0) {
        refresh();
      }
      poll();
    }, every > 0 ? every : 2000);
  }
  poll();
  // Leaving the page closes its stream: a page kept in the back/forward cache would hold
  // one of the few connections a browser opens to this host (six), and after a few live
  // pages the next page would wait for a free one. Shown again from that cache, the page
  // reads itself afresh (and opens a new stream).
  window.addEventListener("pagehide", function () {
    source.close();
  });
  window.addEventListener("pageshow", function (e) {
    if (e.persisted) {
      location.reload();
    }
  });
})();
