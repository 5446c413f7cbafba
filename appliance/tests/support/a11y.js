// The console's accessibility check, run in the page by the browser test. axe-core is not
// packaged in Debian, so this is its serious rules that apply to server-rendered pages,
// written out: the document has a language and a title; every image (and SVG drawn as one)
// has a text alternative; every button, link, form control and progress bar has a name;
// ids are unique; lists hold list items; no interactive element sits inside another; and
// every visible text meets WCAG AA contrast against the background it is drawn on (4.5:1,
// 3:1 for large text), in the colour scheme the page is shown in. Returns the violations as
// strings ("rule: element: detail"); none is a pass.
return (function () {
  "use strict";
  var out = [];
  function where(el) {
    var s = el.tagName.toLowerCase();
    if (el.id) {
      s += "#" + el.id;
    }
    if (el.className && typeof el.className === "string") {
      s += "." + el.className.trim().split(/\s+/).join(".");
    }
    var text = (el.textContent || "").trim().slice(0, 40);
    return text ? s + " \"" + text + "\"" : s;
  }
  function visible(el) {
    if (!el.getClientRects().length) {
      return false;
    }
    var st = getComputedStyle(el);
    return st.visibility !== "hidden" && st.display !== "none";
  }
  function byIds(list) {
    return (list || "")
      .split(/\s+/)
      .map(function (id) {
        var e = id && document.getElementById(id);
        return e ? e.textContent.trim() : "";
      })
      .join(" ")
      .trim();
  }
  // The accessible name, as far as these pages need it.
  function name(el) {
    var n = (el.getAttribute("aria-label") || "").trim() || byIds(el.getAttribute("aria-labelledby"));
    if (n) {
      return n;
    }
    if (el.id) {
      var l = document.querySelector('label[for="' + CSS.escape(el.id) + '"]');
      if (l && l.textContent.trim()) {
        return l.textContent.trim();
      }
    }
    var wrap = el.closest("label");
    if (wrap && wrap.textContent.trim()) {
      return wrap.textContent.trim();
    }
    if (/^(A|BUTTON|SUMMARY)$/.test(el.tagName)) {
      var t = el.textContent.trim();
      if (t) {
        return t;
      }
    }
    if (el.tagName === "INPUT" && /^(submit|button|reset)$/.test(el.type) && el.value) {
      return el.value;
    }
    return (el.getAttribute("title") || "").trim();
  }
  if (!(document.documentElement.getAttribute("lang") || "").trim()) {
    out.push("html-has-lang: html: no lang attribute");
  }
  if (!document.title.trim()) {
    out.push("document-title: title: empty");
  }
  document.querySelectorAll("img").forEach(function (el) {
    if (!el.hasAttribute("alt")) {
      out.push("image-alt: " + where(el) + ": no alt");
    }
  });
  document.querySelectorAll('svg[role="img"]').forEach(function (el) {
    if (!name(el) && !el.querySelector("title")) {
      out.push("svg-img-alt: " + where(el) + ": no text alternative");
    }
  });
  document.querySelectorAll("a[href], button, summary").forEach(function (el) {
    if (!name(el)) {
      out.push("name: " + where(el) + ": no accessible name");
    }
  });
  document
    .querySelectorAll('input:not([type="hidden"]), select, textarea, progress, meter')
    .forEach(function (el) {
      if (!name(el)) {
        out.push("label: " + where(el) + ": no label");
      }
    });
  var ids = {};
  document.querySelectorAll("[id]").forEach(function (el) {
    if (ids[el.id]) {
      out.push("duplicate-id: #" + el.id);
    }
    ids[el.id] = true;
  });
  document.querySelectorAll("ul, ol").forEach(function (el) {
    for (var i = 0; i < el.children.length; i++) {
      if (!/^(LI|SCRIPT|TEMPLATE)$/.test(el.children[i].tagName)) {
        out.push("list: " + where(el) + ": holds a " + el.children[i].tagName.toLowerCase());
      }
    }
  });
  var interactive = "a[href], button, input:not([type=hidden]), select, textarea, summary";
  document.querySelectorAll(interactive).forEach(function (el) {
    if (el.querySelector(interactive)) {
      out.push("nested-interactive: " + where(el));
    }
  });
  // Contrast.
  function rgba(s) {
    var m = s.match(/rgba?\(([^)]+)\)/);
    if (!m) {
      return null;
    }
    var p = m[1].split(/[ ,\/]+/).filter(Boolean).map(parseFloat);
    return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 };
  }
  function lum(c) {
    function ch(v) {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    }
    return 0.2126 * ch(c.r) + 0.7152 * ch(c.g) + 0.0722 * ch(c.b);
  }
  function over(top, under) {
    var a = top.a;
    return {
      r: top.r * a + under.r * (1 - a),
      g: top.g * a + under.g * (1 - a),
      b: top.b * a + under.b * (1 - a),
      a: 1,
    };
  }
  // The background an element's text is drawn on: its and its ancestors' colours, composed.
  function background(el) {
    var layers = [];
    for (var e = el; e; e = e.parentElement) {
      var c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) {
        layers.push(c);
        if (c.a >= 1) {
          break;
        }
      }
    }
    var canvas = rgba(getComputedStyle(document.documentElement).backgroundColor);
    var bg = canvas && canvas.a > 0 ? canvas : { r: 255, g: 255, b: 255, a: 1 };
    if (layers.length && layers[layers.length - 1].a >= 1) {
      bg = layers.pop();
    }
    while (layers.length) {
      bg = over(layers.pop(), bg);
    }
    return bg;
  }
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  var checked = new Set();
  for (var t = walker.nextNode(); t; t = walker.nextNode()) {
    var el = t.parentElement;
    if (!t.textContent.trim() || !el || checked.has(el)) {
      continue;
    }
    checked.add(el);
    if (/^(OPTION|SCRIPT|STYLE|TITLE|PROGRESS|METER)$/.test(el.tagName) || el.closest("svg")) {
      continue;
    }
    if (!visible(el) || el.closest("[disabled]")) {
      continue;
    }
    var st = getComputedStyle(el);
    var fg = rgba(st.color);
    if (!fg) {
      continue;
    }
    var bg = background(el);
    if (fg.a < 1) {
      fg = over(fg, bg);
    }
    var l1 = lum(fg);
    var l2 = lum(bg);
    var ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    var size = parseFloat(st.fontSize);
    var bold = parseInt(st.fontWeight, 10) >= 700;
    var need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    if (ratio < need) {
      out.push(
        "color-contrast: " + where(el) + ": " + ratio.toFixed(2) + ":1 (needs " + need + ":1)"
      );
    }
  }
  return out;
})();
