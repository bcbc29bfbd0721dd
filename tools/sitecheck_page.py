"""What :mod:`tools.sitecheck` looks at inside each page: the scripts it runs there and the link resolver.

* ``HOOKS``: hooks on the page's connection APIs (WebSocket, fetch, beacons, WebRTC...), installed
  before any page script runs;
* ``LINK_HINTS``, ``WAIT_MATHJAX``, ``WAIT_ANIMATIONS``: preconnect-style links, and the waits for
  MathJax and the theme's transitions before the page is inspected;
* ``INSPECT``: the layout and text checks (overflow, clipping, junk text) and the page's links;
* :func:`broken_links`: which of a page's links to the served site do not resolve (no file, or no
  element with the ``#anchor``'s id in it), read from the built files.

The driver (serving the site, the browser, the report) is :mod:`tools.sitecheck`, which re-exports
these names.
"""
from __future__ import annotations

import html
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Hooks on the page's connection APIs, installed before any page script runs: each reports
# (type, absolute URL) to Python through the exposed binding, which survives navigations.
HOOKS = r"""
(() => {
  const report = (type, url) => {
    try {
      const abs = (url instanceof Request) ? url.url : new URL(String(url), location.href).href;
      window.__ctrlsConnection(type, abs);
    } catch (e) {
      try { window.__ctrlsConnection(type, String(url)); } catch (e2) {}
    }
  };
  const hookCtor = (name, type) => {
    const C = window[name];
    if (typeof C !== 'function') return;
    window[name] = new Proxy(C, {construct(t, args, nt) { report(type, args[0]); return Reflect.construct(t, args, nt); }});
  };
  hookCtor('WebSocket', 'websocket');
  hookCtor('EventSource', 'eventsource');
  hookCtor('WebTransport', 'webtransport');
  hookCtor('Worker', 'worker');
  hookCtor('SharedWorker', 'sharedworker');
  if (typeof window.fetch === 'function') {
    window.fetch = new Proxy(window.fetch, {apply(t, self, args) { report('fetch', args[0]); return Reflect.apply(t, self, args); }});
  }
  if (window.XMLHttpRequest) {
    const open = XMLHttpRequest.prototype.open;
    XMLHttpRequest.prototype.open = function (method, url, ...rest) { report('xhr', url); return open.call(this, method, url, ...rest); };
  }
  if (navigator.sendBeacon) {
    const beacon = navigator.sendBeacon.bind(navigator);
    navigator.sendBeacon = (url, data) => { report('sendbeacon', url); return beacon(url, data); };
  }
  const RTC = window.RTCPeerConnection;
  if (typeof RTC === 'function') {
    const servers = (config) => {
      for (const s of (config && config.iceServers) || []) {
        for (const u of [].concat(s.urls || s.url || [])) { try { window.__ctrlsConnection('webrtc', String(u)); } catch (e) {} }
      }
    };
    window.RTCPeerConnection = new Proxy(RTC, {construct(t, args, nt) { servers(args[0]); return Reflect.construct(t, args, nt); }});
    const setConf = RTC.prototype.setConfiguration;
    if (setConf) RTC.prototype.setConfiguration = function (config) { servers(config); return setConf.call(this, config); };
  }
})();
"""  # noqa: E501

# Links that make the browser connect to a host without a request of their own (preconnect) or
# before any is needed; found in the page after it settles.
LINK_HINTS = """
() => Array.from(document.querySelectorAll('link[rel][href]'))
  .map((l) => [l.rel.toLowerCase(), l.href])
  .filter(([rel]) => /\\b(preconnect|dns-prefetch|prefetch|preload|modulepreload|prerender)\\b/.test(rel))
"""

# Wait for MathJax 3 (when the page loads it) to finish its first typesetting pass, then for the
# web fonts it asked for. Resolves to "none", "done", "timeout" or "error: ...".
WAIT_MATHJAX = """
async (timeoutMs) => {
  const hasScript = !!document.querySelector('script[src*="mathjax" i], script[src*="tex-" i]');
  const deadline = Date.now() + timeoutMs;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  if (!hasScript && !window.MathJax) return "none";
  // MathJax is loaded async: window.MathJax is first the config object, then the real one.
  while (!(window.MathJax && window.MathJax.startup && window.MathJax.startup.promise)) {
    if (Date.now() > deadline) return "timeout";
    await sleep(50);
  }
  const left = Math.max(0, deadline - Date.now());
  try {
    const ok = await Promise.race([
      window.MathJax.startup.promise.then(() => true),
      sleep(left).then(() => false),
    ]);
    if (!ok) return "timeout";
    if (document.fonts && document.fonts.ready) await document.fonts.ready;
    return "done";
  } catch (e) {
    return "error: " + e;
  }
}
"""


WAIT_ANIMATIONS = """
async (timeoutMs) => {
  const running = document.getAnimations().filter((a) => a.effect && a.effect.getTiming().iterations !== Infinity);
  await Promise.race([Promise.allSettled(running.map((a) => a.finished)),
                      new Promise((r) => setTimeout(r, timeoutMs))]);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
}
"""
# Layout and text checks, run in the page after MathJax is done, with ``{scrollOk}``: at a narrow
# width (390 px) an element may scroll sideways inside its own box (its own or an ancestor's
# ``overflow-x: auto|scroll``), as long as that box fits its container; at 1280 px nothing may. At
# every width an element whose content is cut off (``overflow-x: hidden|clip`` on a wider content),
# and any text that a box with ``overflow: hidden|clip`` (either axis) cuts off,
# is clipped. Returns {overflow, junk, links, pageWidth}; links are [href attribute, absolute URL,
# where] for every <a href> of the document.
INSPECT = r"""
({scrollOk}) => {
  const root = document.querySelector('main article, article.bd-article, main, [role=main]') || document.body;
  // the first n characters by code point: slicing UTF-16 units can leave half a surrogate pair (a math
  // italic letter), which no UTF-8 writer accepts
  const head = (s, n) => Array.from(s).slice(0, n).join('');
  const visible = (el) => {
    if (!el.getClientRects().length) return false;
    const st = getComputedStyle(el);
    return st.visibility !== 'hidden' && st.display !== 'none';
  };
  const heading = (el) => {
    // The nearest section heading before the element, for the report.
    const all = Array.from(root.querySelectorAll('h1, h2, h3, h4'));
    let best = null;
    for (const h of all) {
      if (h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) best = h; else break;
    }
    return best ? head(best.textContent.replace(/[#¶]/g, '').trim(), 60) : '';
  };
  const describe = (el) => {
    let d = el.tagName.toLowerCase();
    if (el.id) d += '#' + el.id;
    const cls = (typeof el.className === 'string' ? el.className : '').trim().split(/\s+/).filter(Boolean).slice(0, 3);
    if (cls.length) d += '.' + cls.join('.');
    const text = head((el.innerText || el.textContent || '').replace(/\s+/g, ' ').trim(), 50);
    const h = heading(el);
    return d + (h ? ` under "${h}"` : '') + (text ? `: "${text}"` : '');
  };
  // the content width of el's parent, and whether el's box is wider than it
  const wider = (el) => {
    const parent = el.parentElement;
    const box = el.getBoundingClientRect();
    let cw = parent ? parent.clientWidth : box.width;
    if (parent) {
      const ps = getComputedStyle(parent);
      cw -= (parseFloat(ps.paddingLeft) || 0) + (parseFloat(ps.paddingRight) || 0);
    }
    return (cw > 0 && box.width > cw + 1) ? `width ${Math.round(box.width)} > container ${Math.round(cw)}` : null;
  };
  // the element itself or its nearest ancestor inside the article that scrolls sideways
  const scrollBox = (el) => {
    // (the article itself scrolling is not a box of the element's own)
    for (let a = el; a && a !== root && root.contains(a); a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o === 'auto' || o === 'scroll') return a;
    }
    return null;
  };
  const overflow = [];
  const seen = new Set();
  const SEL = 'table, pre, div.highlight, mjx-container[display="true"], div.math, .math-wrapper, ' +
              'div.cell_output, div.output, .output_area, img, figure, svg';
  for (const el of root.querySelectorAll(SEL)) {
    if (!visible(el) || seen.has(el)) continue;
    // an SVG inside MathJax is measured through its mjx-container
    if (el.tagName.toLowerCase() === 'svg' && el.closest('mjx-container')) continue;
    let why = null;
    let target = el;
    const ox = getComputedStyle(el).overflowX;
    if ((ox === 'hidden' || ox === 'clip') && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
      why = `clipped: scrollWidth ${el.scrollWidth} > clientWidth ${el.clientWidth} (overflow-x: ${ox})`;
    } else {
      // at a narrow width, the box that scrolls (the element or its nearest scrolling ancestor in the
      // article) is what must fit; what is inside it may be as wide as it likes
      const box = scrollOk ? scrollBox(el) : null;
      if (box) {
        target = box;
        if (box !== el && seen.has(box)) continue;
        seen.add(box);
        why = wider(box);
      } else {
        if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
          why = `scrollWidth ${el.scrollWidth} > clientWidth ${el.clientWidth}`;
        } else if ((why = wider(el))) {
          // cut off by an ancestor that hides what sticks out: the reader never sees it
          for (let a = el.parentElement; a && root.contains(a); a = a.parentElement) {
            const o = getComputedStyle(a).overflowX;
            if (o === 'hidden' || o === 'clip') {
              const tag = a.tagName.toLowerCase() + (a.id ? '#' + a.id : '');
              why = `clipped by ${tag} (overflow-x: ${o}): ${why}`;
              break;
            }
            if (a === root) break;
          }
        }
      }
    }
    if (why) {
      overflow.push({element: describe(target), why, node: target});
      // report the innermost offender once: skip its descendants of the same kinds
      el.querySelectorAll(SEL).forEach((c) => seen.add(c));
    }
  }
  // text cut off by a box that hides what sticks out (overflow hidden or clip, either axis): the
  // reader never sees it. Screen-reader text is not shown anyway: boxes of 2 px or less, and text under
  // a CSS clip or clip-path (MathJax's assistive MathML copy of every formula).
  const HIDES = new Set(['hidden', 'clip']);
  const reported = overflow.map((o) => o.node).filter(Boolean);
  const clipped = new Map();
  const unseen = (el) => {  // el or an ancestor is clipped away on purpose
    if (!el) return false;
    if (!clipped.has(el)) {
      const st = getComputedStyle(el);
      clipped.set(el, (st.clip && st.clip !== 'auto') || (st.clipPath && st.clipPath !== 'none') ||
                      unseen(el.parentElement));
    }
    return clipped.get(el);
  };
  for (const box of [root, ...root.querySelectorAll('*')]) {
    const st = getComputedStyle(box);
    const hx = HIDES.has(st.overflowX), hy = HIDES.has(st.overflowY);
    if (!(hx || hy) || !visible(box) || unseen(box)) continue;
    if (!((hx && box.scrollWidth > box.clientWidth + 1) || (hy && box.scrollHeight > box.clientHeight + 1))) continue;
    const b = box.getBoundingClientRect();
    if (b.width <= 2 || b.height <= 2) continue;
    if (reported.some((e) => e === box || box.contains(e) || e.contains(box))) continue;  // said above
    const left = b.left + (parseFloat(st.borderLeftWidth) || 0), right = left + box.clientWidth;
    const top = b.top + (parseFloat(st.borderTopWidth) || 0), bottom = top + box.clientHeight;
    const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    let cut = null;
    for (let t = walk.nextNode(); t && !cut; t = walk.nextNode()) {
      if (!t.data.trim() || !t.parentElement || !visible(t.parentElement) || unseen(t.parentElement)) continue;
      const range = document.createRange();
      range.selectNodeContents(t);
      for (const r of range.getClientRects()) {
        if (r.width <= 0 || r.height <= 0) continue;
        const past = hx && r.right > right + 1 ? `${Math.round(r.right - right)} px past its right edge`
                   : hx && r.left < left - 1 ? `${Math.round(left - r.left)} px past its left edge`
                   : hy && r.bottom > bottom + 1 ? `${Math.round(r.bottom - bottom)} px past its bottom edge`
                   : hy && r.top < top - 1 ? `${Math.round(top - r.top)} px past its top edge` : null;
        if (past) { cut = `text clipped (overflow: ${st.overflowX} ${st.overflowY}): "${head(t.data.trim(), 40)}" ends ${past}`; break; }
      }
    }
    if (cut) { overflow.push({element: describe(box), why: cut, node: box}); reported.push(box); }
  }
  overflow.forEach((o) => delete o.node);
  const pageWidth = document.documentElement.scrollWidth;
  if (pageWidth > window.innerWidth + 1) {
    // name what sticks out: the innermost visible elements past the window's right edge
    const W = window.innerWidth;
    const out = [];
    for (const el of root.querySelectorAll('*')) {
      if (out.length >= 3) break;
      if (!visible(el) || el.getBoundingClientRect().right <= W + 1) continue;
      if (Array.from(el.children).some((c) => c.getBoundingClientRect().right > W + 1)) continue;
      if (out.some((o) => o.contains(el))) continue;
      let held = false;  // inside a box that scrolls or clips: that box, not the page, takes it
      for (let a = el.parentElement; a && a !== root && root.contains(a); a = a.parentElement) {
        if (getComputedStyle(a).overflowX !== 'visible') { held = true; break; }
      }
      if (!held) out.push(el);
    }
    const names = out.map((el) => describe(el)).join('; ');
    overflow.push({element: 'page', why: `page scrollWidth ${pageWidth} > window ${W}` +
                                         (names ? `; sticking out: ${names}` : '')});
  }

  const junk = [];
  const add = (kind, el, text) => junk.push({kind, element: describe(el), text: head(text, 80)});
  const PROGRESS = /\d{1,3}%\|[^|\n]{0,60}\|\s*\d+\/\d+|\d+(?:\.\d+)?\s*(?:it|s)\/(?:it|s)\]|[█▏▎▍▌▋▊▉]{3,}/;
  const PATH = /(?:^|[\s'"(=:,\[])(\/(?:work|tmp|root|home|Users|private\/var)\/[^\s'"<>)]*)/;
  const NAN = /(?:^|[^\w.])(nan|NaN)(?![\w.])/;
  const NONE = /(?:[=:(,\[]\s*|\banswer\s+)None\b/;
  const BARE = /^\s*(nan|NaN|None|<NA>|NaT)\s*$/;
  // placeholders and work-log text: the book is a product, not the notes of its making
  const WORKLOG = /\b(?:TODO|FIXME|TBD|XXX)\b/;
  const WORKLOG_I = /\bnot yet set\b|\bissues? #\s?\d+|\bissue \d+,? items?\b|\blent to (?:us|me|this session)\b|\brepo_url\b|\bplaceholder\b|\bthis session\b|\bwork[- ]log\b/i;
  // text blocks: paragraphs, list items, cells, output lines; code inputs are the author's code
  const blocks = root.querySelectorAll('p, li, td, th, dd, dt, caption, figcaption, pre, h1, h2, h3, h4, span.pre, code');
  for (const el of blocks) {
    if (!visible(el)) continue;
    const authored = el.closest('div.cell_input') ||
                     (el.closest('[class*="highlight-"]') && !el.closest('div.cell_output, div.output'));
    if (authored) {
      // the author's code (a code cell's input, a code block of a page): `None`/`nan` are Python
      // there; only absolute paths are junk
      const t = el.innerText || '';
      const m = PATH.exec(t);
      if (m && el.tagName.toLowerCase() === 'pre') add('absolute path', el, m[1]);
      continue;
    }
    // look at the element's own text lines only once: leaf-ish blocks
    if (el.querySelector('p, li, td, pre, table')) continue;
    const t = el.innerText || '';
    let m;
    if ((el.tagName === 'TD' || el.tagName === 'TH') && BARE.test(t)) { add('bare nan/None cell', el, t.trim()); continue; }
    if ((m = PROGRESS.exec(t))) { add('progress bar', el, m[0]); continue; }
    if ((m = PATH.exec(t))) { add('absolute path', el, m[1]); continue; }
    const lines = t.split('\n');
    const bare = lines.find((l) => BARE.test(l));
    if (bare !== undefined && el.tagName === 'PRE') { add('bare nan/None line', el, bare.trim()); continue; }
    if ((m = NAN.exec(t))) { add('nan in text', el, t.slice(Math.max(0, m.index - 30), m.index + 10)); continue; }
    if ((m = NONE.exec(t))) { add('None in text', el, t.slice(Math.max(0, m.index - 30), m.index + 10)); continue; }
    if ((m = WORKLOG.exec(t) || WORKLOG_I.exec(t))) {
      add('placeholder or work-log text', el, t.slice(Math.max(0, m.index - 30), m.index + m[0].length + 20));
      continue;
    }
  }
  const links = Array.from(document.querySelectorAll('a[href]')).map((a) => {
    const text = head((a.innerText || a.textContent || '').replace(/\s+/g, ' ').trim(), 40);
    const h = root.contains(a) ? heading(a) : null;
    const where = h === null ? 'in the navigation' : (h ? `under "${h}"` : 'in the article');
    return [a.getAttribute('href'), a.href, where + (text ? `: "${text}"` : '')];
  });
  return {overflow, junk, links, pageWidth};
}
"""  # noqa: E501



def _ids(path: Path, cache: dict) -> set[str]:
    """The ids (and ``<a name>``s) of the elements of a built HTML file, read once."""
    if path not in cache:
        text = path.read_text(encoding="utf-8", errors="replace")
        cache[path] = {html.unescape(m.group(2)) for m in _ID.finditer(text)}
    return cache[path]


_ID = re.compile(r"""\s(?:id|name)\s*=\s*(["'])(.*?)\1""", re.IGNORECASE | re.DOTALL)


def broken_links(links, base_url: str, html_dir: str | os.PathLike, cache: dict | None = None) -> list[dict]:
    """The links among ``links`` ([href attribute, absolute URL, where] triples, as INSPECT returns
    them) that point into the site served at ``base_url`` from ``html_dir`` and do not resolve: no
    such file (a directory resolves to its index.html), or, for ``page#anchor``, no element with
    that id in the file. Each is ``{"href", "why", "element"}``, once per href. Links elsewhere
    (another host, ``mailto:``, ``javascript:``) are not judged here: another host is external."""
    html_dir = Path(html_dir)
    cache = {} if cache is None else cache
    base = urlsplit(base_url)
    out, done = [], set()
    for href, url, where in links:
        if href in done:
            continue
        done.add(href)
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or u.netloc != base.netloc or not u.path.startswith(base.path):
            continue
        rel = unquote(u.path[len(base.path):])
        target = html_dir / rel if rel else html_dir
        if target.is_dir():
            target = target / "index.html"
        why = None
        if not target.is_file():
            why = f"no file {target.relative_to(html_dir).as_posix() if rel else 'index.html'}"
        elif u.fragment and target.suffix == ".html":
            anchor = unquote(u.fragment)
            if anchor not in _ids(target, cache):
                why = f"no element with id {anchor!r} in {target.relative_to(html_dir).as_posix()}"
        if why:
            out.append({"href": href, "why": why, "element": where})
    return out
