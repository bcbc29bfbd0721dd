"""Open the built book in a real headless browser: screenshots, missing assets, external requests.

``check_site(html_dir, out_dir)`` serves a built Jupyter Book (``book/_build/html``) on
``127.0.0.1`` from a thread, opens some of its pages in Debian's Chromium (``/usr/bin/chromium``,
driven by Playwright), and for each page:

* records every request the page makes;
* records every connection the page opens, of every kind, with its type (``connections``): resource
  loads, ``fetch``/``XMLHttpRequest``, ``EventSource``, ``navigator.sendBeacon``, WebSocket,
  WebTransport, WebRTC ICE servers, workers' requests, ``<link rel=preconnect|dns-prefetch|...>``, and
  the requests of any window the page opens (``window.open``);
  seen three ways: Playwright's request routing (HTTP and WebSocket), the DevTools protocol's
  network events, and hooks on the page's JavaScript connection APIs;
* aborts every request and WebSocket whose host is not ``127.0.0.1``/``localhost``/``::1`` and
  records every such connection as *external* (the book must not depend on a CDN). None leaves the
  machine: besides the aborts, the browser's only route to other hosts is a proxy on a closed
  loopback port (``--proxy-server`` with ``<-loopback>``), and WebRTC may not use UDP outside it;
* records as *missing* every request that failed or whose response has status >= 400;
* waits for the network to go idle and for MathJax (when the page loads it) to finish typesetting,
  then takes a full-page PNG screenshot into ``out_dir``;
* records as *overflow* every visible table, math display or code block that is wider than its
  container (its ``scrollWidth`` exceeds its ``clientWidth``, or its box is wider than its parent's
  content box), and the page itself when it scrolls horizontally; at 1280 px nothing may scroll
  sideways, at 390 px (a phone) a wide table may scroll inside its own box (``overflow-x: auto``),
  which must itself fit; content cut off by ``overflow-x: hidden``, and any text that a box with
  ``overflow: hidden`` (either axis) cuts off, is *clipped*, at every width;
* records as *junk* visible text that a reader should never see: a tqdm progress bar, a bare
  ``nan``/``None`` (a table cell or output line that is only that, ``nan`` anywhere, ``= None``),
  an absolute build path (``/work/``, ``/tmp/``, ``/root/``, ``/home/``), or placeholder and
  work-log text (``TODO``, "not yet set", ``repo_url``, "issue #26", "lent to us", ...);
* records as *broken links* the page's links into the site that do not resolve: no such file, or,
  for ``page.html#anchor``, no element with that id.

Every overflow and junk finding names the element (tag, id/classes, the section heading above it
and the start of its text), so a failure says where to look.

It returns a report (a dict; see :func:`check_site`). Run it from the command line with::

    python -m tools.sitecheck [HTML_DIR] [--out DIR]

which checks at 1280 and 390 px (``--width``), prints the reports and exits 1 when a page has a
missing asset, made an external request, overflows, shows junk or has a broken link (defaults:
``book/_build/html``, every page of it, and ``book/_build/screenshots``, the 390 px ones in its
``390px/``). The in-page scripts and the link resolver are in :mod:`tools.sitecheck_page`.

Playwright (the ``dev`` extra) drives the browser; its own browser download
(``playwright install``) is never used: the browser is Debian's ``chromium`` package
(``apt-get install -y chromium``; ``make test`` installs it).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from tools.sitecheck_page import (  # noqa: F401 - re-exported: the in-page scripts and the link resolver
    HOOKS,
    INSPECT,
    LINK_HINTS,
    WAIT_ANIMATIONS,
    WAIT_MATHJAX,
    broken_links,
)

CHROMIUM = "/usr/bin/chromium"
# Known to work with Debian's chromium as root, in a container, with no network but loopback.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    # nothing reaches another host even if a page finds a way past the recording: every non-local
    # connection (a preconnect, a WebSocket) goes to a proxy on a closed port (PROXY_ARGS), and
    # WebRTC may not send UDP around it
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    # and no name lookup leaves the machine either (a dns-prefetch, a proxied host): only localhost resolves
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE [::1]",
]
DEFAULT_PAGES = ("index.html", "generated/02_exploration.html")  # kept first by all_pages()
# Pages Sphinx generates that are not the book's content.
NON_CONTENT = {"search.html", "genindex.html", "py-modindex.html"}
# Screenshot file names for the default pages; any other page gets its path with '/' -> '_'.
SCREENSHOT_NAMES = {"index.html": "index.png", "generated/02_exploration.html": "table1.png"}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
# ``<-loopback>``: only the hosts listed bypass the proxy (Chromium would bypass all of 127.0.0.0/8)
PROXY_BYPASS = "<-loopback>;127.0.0.1;localhost;[::1]"

IDLE_MS = 500  # as Playwright's "networkidle": no request in flight for this long
VIEWPORT = {"width": 1280, "height": 900}
# The widths `python -m tools.sitecheck` (make check-site) checks: a laptop, and a phone (390 px,
# 844 high), where a wide table may scroll inside its own box but nothing may widen the page.
WIDTHS = (1280, 390)
NARROW = 800  # below this width, scrolling inside an element's own box is allowed
MIN_WIDTH, MAX_WIDTH = 240, 7680  # a window narrower than a small watch or wider than 8K is a typo, not a device


def viewport(width: int) -> dict:
    return dict(VIEWPORT) if width == VIEWPORT["width"] else {"width": int(width), "height": 900 if width >= NARROW else 844}

_META_REFRESH = re.compile(r"""<meta[^>]+http-equiv\s*=\s*["']?refresh""", re.IGNORECASE)


class SiteCheckError(RuntimeError):
    """The check could not run (no browser, no Playwright, no built site)."""


def is_local(url: str) -> bool:
    """True for a URL that stays on this machine: loopback http(s)/ws(s), or data:/blob:/about:
    URLs. A protocol-relative ``//host/...`` and a WebRTC ``stun:host:port`` are judged by host."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("data", "blob", "about", "chrome-error", "javascript") or (not scheme and not parts.netloc):
        return True
    try:
        host = parts.hostname
        if host is None and scheme in ("stun", "stuns", "turn", "turns"):
            host = urlsplit("//" + parts.path.split("?")[0]).hostname
    except ValueError:  # a malformed port or address: not known to be local
        return False
    return (host or "") in LOCAL_HOSTS


@contextmanager
def closed_port():
    """A loopback TCP port where nothing listens (bound, never listened on, while in use): the proxy
    every non-local connection of the browser is sent to, so that it fails at once."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))  # holding the port (without listen) keeps anyone else off it
        yield sock.getsockname()[1]
    finally:
        sock.close()


def screenshot_name(page: str) -> str:
    if page in SCREENSHOT_NAMES:
        return SCREENSHOT_NAMES[page]
    stem = page[: -len(".html")] if page.endswith(".html") else page
    return stem.strip("/").replace("/", "_") + ".png"


def find_chromium(executable: str | os.PathLike | None = None) -> str:
    """The Chromium binary to use, or a SiteCheckError that says how to install it."""
    exe = str(executable or os.environ.get("CTRLS_CHROMIUM") or CHROMIUM)
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        found = shutil.which(exe) if os.sep not in exe else None
        if not found:
            raise SiteCheckError(
                f"Chromium not found at {exe}: install Debian's package with "
                "`apt-get update && apt-get install -y chromium` (`make test` does this)")
        exe = found
    return exe


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextmanager
def serve(directory: str | os.PathLike):
    """Serve ``directory`` over HTTP on 127.0.0.1 on a free port, from a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="sitecheck-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _check_page(context, url: str, shot: Path | None, timeout_ms: int, *, base: str, html_dir: Path,
                scroll_ok: bool = False, ids: dict | None = None) -> dict:
    page = context.new_page()
    requests: list[str] = []
    missing: dict[str, str] = {}  # url -> why (first reason seen)
    external: list[str] = []
    console_errors: list[str] = []
    connections: list[dict] = []  # every connection of every kind: {"type", "url"}, first sighting of each
    seen: set[tuple[str, str]] = set()

    def connection(kind: str, u: str) -> None:
        """Record a connection (once per type and URL); a non-local one is external."""
        if (kind, u) not in seen:
            seen.add((kind, u))
            connections.append({"type": kind, "url": u})
        if not is_local(u) and u not in external:
            external.append(u)

    pending: dict = {}  # request -> url, while in flight (our own idle test: it can name what is pending)
    quiet = [time.monotonic()]  # when the last request ended

    def on_request(req):
        requests.append(req.url)
        connection(req.resource_type, req.url)
        pending[req] = req.url

    def on_done(req):
        if pending.pop(req, None) is not None:
            quiet[0] = time.monotonic()

    def on_response(resp):
        if resp.status >= 400:
            missing.setdefault(resp.url, f"HTTP {resp.status}")

    def on_failed(req):
        on_done(req)
        if is_local(req.url):  # external requests fail because we abort them: recorded as external
            missing.setdefault(req.url, req.failure or "failed")

    def on_console(msg):
        if msg.type == "error":
            console_errors.append(msg.text)

    def route(r):
        if is_local(r.request.url):
            r.continue_()
        else:  # recorded, and never let out
            connection(r.request.resource_type, r.request.url)
            r.abort("blockedbyclient")

    def route_ws(ws):
        connection("websocket", ws.url)
        if is_local(ws.url):
            ws.connect_to_server()
        else:  # never connected: the page sees a socket that closes
            ws.close(code=1008, reason="blocked by tools.sitecheck: not a local host")

    def attach(p, where: str = "") -> None:
        """Record p's requests, responses, failures and console errors, and route its connections."""
        for event, fn in (("request", on_request), ("response", on_response), ("requestfailed", on_failed),
                          ("requestfinished", on_done),
                          ("console", on_console), ("websocket", lambda ws: connection("websocket", ws.url)),
                          ("pageerror", lambda exc: console_errors.append(f"uncaught{where}: {exc}"))):
            p.on(event, fn)
        p.route("**/*", route)
        p.route_web_socket(lambda u: True, route_ws)

    attach(page)
    # A window the page opens (window.open, target=_blank) is the page's too: its first request meets
    # the context's route (the page's own routes take precedence on the page), the rest its own.
    popups: list = []

    def watch(popup):
        popups.append(popup)
        attach(popup, " in a popup")

    page.on("popup", watch)
    context.route("**/*", route)
    context.route_web_socket(lambda u: True, route_ws)
    # the JavaScript APIs' own view (sendBeacon, EventSource, WebRTC ICE servers, ...)
    page.expose_function("__ctrlsConnection", lambda kind, u: connection(str(kind), str(u)))
    page.add_init_script(HOOKS)
    # the DevTools protocol's view of the network: every request with its type, WebSockets, WebTransport
    try:
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.on("Network.requestWillBeSent",
               lambda e: connection(str(e.get("type", "Other")).lower(), e["request"]["url"]))
        cdp.on("Network.webSocketCreated", lambda e: connection("websocket", e["url"]))
        cdp.on("Network.webTransportCreated", lambda e: connection("webtransport", e["url"]))
    except Exception as e:  # noqa: BLE001 - the routes and hooks above still record; say so
        console_errors.append(f"sitecheck: no DevTools network events ({e})")

    response = None
    try:
        response = page.goto(url, wait_until="load", timeout=timeout_ms)
    except Exception as e:  # noqa: BLE001 - a page that cannot load is reported, not raised
        missing.setdefault(url, str(e).splitlines()[0])
    # Jupyter Book's index.html is a <meta http-equiv="refresh"> redirect to the root page; read it
    # from the response (the page itself may already be gone), then wait for the page it leads to.
    try:
        body = response.text() if response is not None and response.ok else ""
    except Exception:  # noqa: BLE001 - body no longer available
        body = ""
    if _META_REFRESH.search(body):
        try:
            page.wait_for_url(lambda u: u != url, wait_until="load", timeout=timeout_ms)
        except Exception:  # noqa: BLE001 - a refresh that never happens: screenshot what is there
            pass

    warnings: list[str] = []

    def settle(what: str):
        """Wait until no request has been in flight for IDLE_MS (Playwright's "networkidle", counted here
        so that a timeout can name what was pending); a page that never goes idle is screenshot anyway."""
        deadline = time.monotonic() + timeout_ms / 1000
        while pending or time.monotonic() - quiet[0] < IDLE_MS / 1000:
            if time.monotonic() > deadline:
                left = sorted(set(pending.values()))
                warnings.append(f"network not idle after {timeout_ms} ms ({what}): "
                                + (f"{len(left)} pending: {', '.join(left[:5])}" if left
                                   else "requests kept starting"))
                return
            page.wait_for_timeout(50)  # pumps the page's events

    settle("load")
    mathjax = page.evaluate(WAIT_MATHJAX, timeout_ms)
    settle("mathjax")  # the fonts MathJax asked for
    n_math = page.evaluate("() => document.querySelectorAll('mjx-container').length")
    # The theme slides its sidebars in with CSS transitions: let them end (finite ones are also
    # fast-forwarded by animations="disabled"), else the screenshot catches them half-way.
    page.evaluate(WAIT_ANIMATIONS, 5000)
    for rel, href in page.evaluate(LINK_HINTS):  # a preconnect opens a connection without a request
        connection(next(k for k in ("preconnect", "dns-prefetch", "modulepreload", "prefetch", "preload",
                                    "prerender") if k in rel), href)
    inspected = page.evaluate(INSPECT, {"scrollOk": scroll_ok})
    if shot is not None:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True, animations="disabled")
    report = {
        "url": url,
        "final_url": page.url,
        "title": page.title(),
        "n_requests": len(requests),
        "requests": requests,
        "missing": list(missing),
        "missing_why": missing,
        "external": external,
        "connections": connections,
        "console_errors": console_errors,
        "mathjax": mathjax,
        "n_math": n_math,
        "warnings": warnings,
        "overflow": inspected["overflow"],
        "junk": inspected["junk"],
        "n_links": len(inspected["links"]),
        "broken_links": broken_links(inspected["links"], base, html_dir, ids),
        "page_width": inspected["pageWidth"],
        "screenshot": None if shot is None else str(shot),
    }
    for popup in popups:
        popup.close()
    context.unroute("**/*", route)
    page.close()
    return report


def all_pages(html_dir: str | os.PathLike) -> list[str]:
    """Every content page of a built book, relative to ``html_dir``: the default pages first, then
    the others in path order (not Sphinx's search/index pages, ``_static``, ``_sources`` or the
    ``_modules`` source listings)."""
    html_dir = Path(html_dir)
    found = sorted(q.relative_to(html_dir).as_posix() for q in html_dir.rglob("*.html"))
    found = [q for q in found if q not in NON_CONTENT and not any(part.startswith("_") for part in q.split("/"))]
    first = [q for q in DEFAULT_PAGES if q in found]
    return first + [q for q in found if q not in first]


def page_ok(r: dict) -> bool:
    return not (r["missing"] or r["external"] or r["overflow"] or r["junk"] or r.get("broken_links"))


def check_width(width) -> None:
    """SiteCheckError unless ``width`` is a window width some device has (an integer in MIN_WIDTH..MAX_WIDTH)."""
    if isinstance(width, bool) or not isinstance(width, int) or not MIN_WIDTH <= width <= MAX_WIDTH:
        raise SiteCheckError(f"width must be an integer between {MIN_WIDTH} and {MAX_WIDTH} px, got {width!r}")


def check_site(html_dir: str | os.PathLike, out_dir: str | os.PathLike,
               pages: tuple[str, ...] | list[str] | None = None, *,
               chromium: str | os.PathLike | None = None, timeout_s: float = 60.0,
               width: int = VIEWPORT["width"], scroll_ok: bool | None = None,
               shots: tuple[str, ...] | list[str] | None = None) -> dict:
    """Open ``pages`` of the site in ``html_dir`` in headless Chromium; screenshot them into ``out_dir``.

    Returns ``{"html_dir", "out_dir", "chromium", "ok", "pages": {page: report}}`` where each page's
    report holds ``url`` (asked for), ``final_url`` (after redirects), ``title``, ``n_requests``,
    ``requests``, ``missing`` (URLs that failed or answered >= 400; ``missing_why`` maps each to
    the reason), ``external`` (URLs on a host other than 127.0.0.1/localhost/::1, of any connection
    type: aborted, never sent), ``connections`` (every connection the page opened, ``{"type",
    "url"}``: resource types such as ``script``, ``fetch``, ``xhr``, ``eventsource``, ``ping`` (a
    beacon), ``websocket``, ``webtransport``, and ``sendbeacon``, ``webrtc``, ``preconnect``...),
    ``console_errors``, ``mathjax`` ("none", "done", "timeout" or "error: ..."), ``n_math`` (formulas
    MathJax typeset), ``warnings`` (waits that timed out, naming the requests still pending), ``overflow`` and ``junk`` (lists of
    ``{"element", "why"}`` and ``{"kind", "element", "text"}``; see the module's docstring),
    ``page_width``, ``n_links`` and ``broken_links`` (``{"href", "why", "element"}``: a link into
    the site with no such file, or no element with its ``#anchor``'s id; :func:`broken_links`) and
    ``screenshot`` (its path, or None). ``pages`` defaults to every page (:func:`all_pages`); ``shots``
    (default: every page checked) names the pages to screenshot -- a full-page screenshot is about a
    third of a page's check, and every other check runs on every page either way.

    ``width`` is the window's width in CSS px (the report's ``width``); ``scroll_ok`` (default: below
    800 px) lets a wide element scroll inside its own box, which must itself fit its container.
    ``ok`` is True when no page has a missing asset, an external request, an overflow, junk or a
    broken link.

    Raises :class:`SiteCheckError` when the site is not built, Chromium is not installed or
    Playwright is not importable.
    """
    check_width(width)
    html_dir = Path(html_dir).resolve()
    out_dir = Path(out_dir).resolve()
    if not (html_dir / "index.html").is_file():
        raise SiteCheckError(f"no index.html in {html_dir}: build the book first "
                             "(`make book`, or `ctrls reproduce --profile smoke`)")
    exe = find_chromium(chromium)
    if pages is None:
        pages = all_pages(html_dir)
    if shots is not None and set(shots) - set(pages):
        raise ValueError(f"shots names pages that are not checked: {sorted(set(shots) - set(pages))}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:  # pragma: no cover - dev extra not installed
        raise SiteCheckError("Playwright is not installed: `pip install -e '.[dev]'` "
                             "(never `playwright install`: the browser is Debian's chromium)") from e

    timeout_ms = int(timeout_s * 1000)
    out_dir.mkdir(parents=True, exist_ok=True)
    if scroll_ok is None:
        scroll_ok = width < NARROW
    report = {"html_dir": str(html_dir), "out_dir": str(out_dir), "chromium": exe, "width": int(width),
              "pages": {}}
    ids: dict = {}  # each target file's ids, read once
    # Never let Playwright look for (or fetch) a browser of its own.
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with serve(html_dir) as base, tempfile.TemporaryDirectory(prefix="ctrls-chromium-") as profile, \
            closed_port() as dead, sync_playwright() as pw:
        args = [*CHROMIUM_ARGS, f"--proxy-server=http://127.0.0.1:{dead}", f"--proxy-bypass-list={PROXY_BYPASS}"]
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=exe, headless=True, args=args,
            viewport=viewport(width), service_workers="block", timeout=timeout_ms)
        try:
            for p in pages:
                shot = out_dir / screenshot_name(p) if shots is None or p in shots else None
                t0 = time.perf_counter()
                report["pages"][p] = _check_page(context, base + p.lstrip("/"), shot, timeout_ms, base=base,
                                                 html_dir=html_dir, scroll_ok=scroll_ok, ids=ids)
                report["pages"][p]["seconds"] = round(time.perf_counter() - t0, 2)  # where a slow check spends its time
        finally:
            context.close()
    report["ok"] = all(page_ok(r) for r in report["pages"].values())
    return report


def format_report(report: dict) -> str:
    """A short human-readable summary of a :func:`check_site` report."""
    lines = [f"site {report['html_dir']} at {report.get('width', VIEWPORT['width'])} px (browser {report['chromium']})"]
    for page, r in report["pages"].items():
        lines.append(f"{page}: {r['title']!r} -> {r['final_url']}"
                     + (f" ({r['seconds']:.1f} s)" if "seconds" in r else ""))
        kinds = {}
        for c in r.get("connections", []):
            kinds.setdefault(c["url"], c["type"])
        lines.append(f"  {r['n_requests']} requests, {len(r['missing'])} missing, "
                     f"{len(r['external'])} external, {len(r['console_errors'])} console errors, "
                     f"mathjax {r['mathjax']} ({r['n_math']} formulas), "
                     f"{len(r['overflow'])} overflowing, {len(r['junk'])} junk, "
                     f"{len(r.get('broken_links', []))} of {r.get('n_links', 0)} links broken")
        lines += [f"  missing:  {u} ({r['missing_why'].get(u, '?')})" for u in r["missing"]]
        lines += [f"  external (blocked): {u} ({kinds.get(u, 'request')})" for u in r["external"]]
        lines += [f"  console:  {m}" for m in r["console_errors"]]
        lines += [f"  warning:  {m}" for m in r["warnings"]]
        lines += [f"  overflow: {page}: {o['element']} ({o['why']})" for o in r["overflow"]]
        lines += [f"  junk:     {page}: {j['kind']} {j['text']!r} in {j['element']}" for j in r["junk"]]
        lines += [f"  link:     {page}: {b['href']} ({b['why']}) {b['element']}" for b in r.get("broken_links", [])]
        if r["screenshot"]:
            lines.append(f"  screenshot: {r['screenshot']}")
    bad = [p for p, r in report["pages"].items() if not page_ok(r)]
    lines.append("OK" if report["ok"] else f"FAILED ({len(bad)} of {len(report['pages'])} pages: "
                 f"{', '.join(bad)}): missing assets, external requests, overflow, junk or broken links")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sitecheck", description=__doc__.split("\n")[0])
    ap.add_argument("html_dir", nargs="?", default="book/_build/html", help="the built site (default: %(default)s)")
    ap.add_argument("--out", default="book/_build/screenshots", help="where screenshots go (default: %(default)s)")
    ap.add_argument("--page", action="append", dest="pages", metavar="PATH",
                    help="a page to open, relative to HTML_DIR (repeatable; default: every page)")
    ap.add_argument("--width", action="append", dest="widths", type=int, metavar="PX",
                    help=f"a window width to check at (repeatable; default: {' and '.join(map(str, WIDTHS))}; "
                         f"screenshots at a width other than {VIEWPORT['width']} go in OUT/<width>px)")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON ({width: report})")
    args = ap.parse_args(argv)
    for w in args.widths or ():  # refused before a browser starts: a 0 px window "finds" every page broken
        try:
            check_width(w)
        except SiteCheckError as e:
            ap.error(f"--{e}")
    reports = {}
    try:
        for w in args.widths or WIDTHS:
            out = Path(args.out) if w == VIEWPORT["width"] else Path(args.out) / f"{w}px"
            reports[w] = check_site(args.html_dir, out, tuple(args.pages) if args.pages else None, width=w)
    except SiteCheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({str(w): r for w, r in reports.items()}, indent=2))
    else:
        print("\n\n".join(format_report(r) for r in reports.values()))
    return 0 if all(r["ok"] for r in reports.values()) else 1

if __name__ == "__main__":
    sys.exit(main())
