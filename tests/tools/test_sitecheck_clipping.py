"""Issue 49, item 5: text that a box with ``overflow: hidden`` cuts off is reported.

Only tables, code, math, images, figures and SVG were measured: a paragraph, a list item or a
heading whose text an ancestor with ``overflow: hidden`` (or ``clip``) cuts off, sideways or at the
bottom, passed the check, though a reader never sees the end of it. Now such text is an *overflow*
finding naming the element and the clipping box. Text a box lets the reader scroll to, screen-reader
text in a 1 px box, and an absolutely placed element that escapes the hiding box are not.

Like tests/tools/test_sitecheck.py these need Debian's /usr/bin/chromium and Playwright.
"""
from __future__ import annotations

from tests.tools.test_sitecheck import chromium  # noqa: F401  (the fixture: Debian's Chromium and Playwright)

_LONG = "a sentence that goes on and on without end " * 12

_PAGE = f"""<!doctype html>
<html><head><title>Clipped text</title>
<style>body {{ margin: 0; }} article {{ display: block; width: 700px; }}
.sr-only {{ position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0, 0, 0, 0); white-space: nowrap; }}
</style></head>
<body><main><article>
<h2>Sideways</h2>
<div id="sideways" style="width: 300px; overflow: hidden"><p id="nowrap" style="white-space: nowrap">{_LONG}</p></div>
<h2>At the bottom</h2>
<div id="short" style="height: 3em; overflow: hidden"><p id="tall">{_LONG * 3}</p></div>
<h2>Clipped by clip</h2>
<ul id="clipbox" style="width: 250px; overflow-x: clip"><li id="item"><span style="white-space: nowrap">{_LONG}</span></li></ul>
<h2>Fine</h2>
<div id="scrolls" style="width: 300px; overflow: auto"><p style="white-space: nowrap">{_LONG}</p></div>
<div id="hidden-but-fits" style="overflow: hidden"><p>Short text in a clearfix box.</p></div>
<p>Read this <span class="sr-only">{_LONG}</span> aloud.</p>
<div id="not-positioned" style="width: 200px; height: 2em; overflow: hidden">
  <div style="position: relative; width: 700px"></div></div>
<div style="position: relative"><div id="static-hider" style="width: 200px; overflow: hidden">
  <span id="tip" style="position: absolute; left: 0; top: 0; width: 400px">an escaping tooltip {_LONG}</span>
</div></div>
</article></main></body></html>
"""


def test_text_cut_off_by_a_hiding_box_is_reported(chromium, tmp_path):
    from tools.sitecheck import check_site, format_report

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>i</title><main><article><p>Fine.</p></article></main>")
    (site / "clipped.html").write_text(_PAGE)
    report = check_site(site, tmp_path / "shots", chromium=chromium, timeout_s=30)
    summary = format_report(report)
    assert report["pages"]["index.html"]["overflow"] == [], summary
    found = {o["element"].split(" ")[0]: o["why"] for o in report["pages"]["clipped.html"]["overflow"]}
    assert found.get("p#nowrap", "").startswith("text clipped by div#sideways (overflow-x: hidden): "), summary
    assert found.get("p#tall", "").startswith("text clipped by div#short (overflow-y: hidden): "), summary
    assert found.get("span", "").startswith("text clipped by ul#clipbox (overflow-x: clip): "), summary
    assert len(found) == 3, summary  # the scrolling box, the box that fits, screen-reader text, the tooltip: not
    assert 'under "Sideways"' in report["pages"]["clipped.html"]["overflow"][0]["element"], summary
    assert not report["ok"] and "clipped.html: p#nowrap" in summary
