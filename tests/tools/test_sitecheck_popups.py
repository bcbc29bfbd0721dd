"""Issue 49, item 5: what a page's popups load is the page's, and is checked.

A page that opens another page (``window.open``, a ``target=_blank`` link it clicks) made requests
the check never saw: the routes and the request events were the first page's only, so a popup could
reach another host unblocked and unrecorded. The routes, events and hooks are now the browser
context's: a popup's requests (its own navigation included) are recorded on the page that opened it,
external ones blocked, and the popup is listed in the report's ``popups``.

Like tests/tools/test_sitecheck.py these need Debian's /usr/bin/chromium and Playwright.
"""
from __future__ import annotations

from tests.tools.test_sitecheck import _TcpCanary, chromium  # noqa: F401  (the fixture: Debian's Chromium)


def _page(title: str, script: str, body: str = "") -> str:
    return (f"<!doctype html><html><head><title>{title}</title></head><body><main><article><h1>{title}</h1>"
            f"{body}</article></main><script>{script}</script></body></html>")


def test_requests_of_popups_are_recorded_blocked_and_the_page_fails(chromium, tmp_path):
    from tools.sitecheck import check_site, format_report

    canary = _TcpCanary()
    h = canary.host
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(_page("Index", ""))
    # a popup straight to another host
    (site / "opens_external.html").write_text(_page("Opener", f"window.open('http://{h}/popup-page');"))
    # a local popup that, in turn, fetches from another host
    (site / "leaky_popup.html").write_text(_page("Leaky popup", f"fetch('http://{h}/from-popup').catch(() => 0);"))
    (site / "opens_local.html").write_text(_page("Opener", "window.open('leaky_popup.html');"))
    # a target=_blank link the page clicks
    (site / "blank_link.html").write_text(_page("Blank", "document.getElementById('out').click();",
                                                f"<a id='out' target='_blank' href='http://{h}/blank'>out</a>"))
    # a local popup that loads nothing external: the page passes
    (site / "quiet_popup.html").write_text(_page("Quiet popup", ""))
    (site / "opens_quiet.html").write_text(_page("Opener", "window.open('quiet_popup.html');"))
    pages = ("opens_external.html", "opens_local.html", "blank_link.html", "opens_quiet.html")
    try:
        report = check_site(site, tmp_path / "shots", pages=pages, chromium=chromium, timeout_s=30)
    finally:
        canary.close()
    summary = format_report(report)
    ext, loc, blank, quiet = (report["pages"][p] for p in pages)

    assert ext["external"] == [f"http://{h}/popup-page"], summary
    assert any(u.startswith(f"http://{h}/popup-page") for u in ext["popups"]), summary
    assert loc["external"] == [f"http://{h}/from-popup"], summary
    assert any(u.endswith("/leaky_popup.html") for u in loc["popups"]), summary
    assert any(c["url"].endswith("/leaky_popup.html") and c["type"] == "document" for c in loc["connections"]), summary
    assert blank["external"] == [f"http://{h}/blank"], summary
    assert canary.hits == [], (canary.hits, summary)  # nothing reached the other host
    assert quiet["external"] == [] and quiet["missing"] == [], summary
    assert any(u.endswith("/quiet_popup.html") for u in quiet["popups"]), summary
    assert not report["ok"] and "popup:" in summary
    # every popup was closed with its page: the next page's report holds nothing of the one before
    assert not any("popup" in u for u in quiet["requests"] if not u.endswith("quiet_popup.html")), summary
