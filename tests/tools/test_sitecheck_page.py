"""The browser check grows. Every internal link of the built site resolves (a file,
and for ``#anchor`` an element with that id); the layout checks also run at 390 px, where a wide table
may scroll inside its own box but must not be clipped or widen the page; placeholder and work-log text
is junk. Hand-made sites prove that each check fails where it should, naming the page and element.

Like tests/tools/test_sitecheck.py these need Debian's /usr/bin/chromium and Playwright (skipped under
CTRLS_SKIP_BROWSER=1); test_broken_links_from_files needs no browser.
"""
from __future__ import annotations

from tests.tools.test_sitecheck import chromium  # noqa: F401  (the fixture: Debian's Chromium and Playwright)

_TABLE = "<table id='{id}'><tr>" + "<td>column&nbsp;value&nbsp;{i}</td>" * 1 + "</tr></table>"


def _wide_table(tid: str) -> str:
    cells = "".join(f"<td>long_column_value_{i}</td>" for i in range(40))
    return f"<table id='{tid}' style='border-collapse: collapse'><tr>{cells}</tr></table>"


_NARROW_PAGE = f"""<!doctype html>
<html><head><title>Narrow</title><meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ margin: 0; }} main, article {{ display: block; }}</style></head>
<body><main><article>
<h2>Scrolls in its box</h2>
<div class="wrap" style="overflow-x: auto">{_wide_table("scrolls")}</div>
<h2>Clipped</h2>
<div id="clipper" style="overflow-x: hidden">{_wide_table("clipped")}</div>
<h2>Widens the page</h2>
{_wide_table("bare")}
</article></main></body></html>
"""

_SCROLL_ONLY_PAGE = f"""<!doctype html>
<html><head><title>Scroll only</title><meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ margin: 0; }}</style></head>
<body><main><article>
<h2>Results</h2>
<div style="overflow-x: auto">{_wide_table("scrolls")}</div>
<p>Short text.</p>
</article></main></body></html>
"""


def test_at_390_a_wide_table_may_scroll_in_its_own_box_but_not_be_clipped_or_widen_the_page(chromium, tmp_path):
    from tools.sitecheck import check_site, format_report, main

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(_SCROLL_ONLY_PAGE)
    (site / "narrow.html").write_text(_NARROW_PAGE)

    report = check_site(site, tmp_path / "shots", chromium=chromium, timeout_s=30, width=390)
    summary = format_report(report)
    assert report["width"] == 390 and "at 390 px" in summary
    ok = report["pages"]["index.html"]
    assert ok["overflow"] == [] and ok["page_width"] <= 390, summary
    bad = report["pages"]["narrow.html"]
    found = {o["element"].split(" ")[0]: o["why"] for o in bad["overflow"]}
    assert found.get("table#clipped", "").startswith("clipped by div#clipper (overflow-x: hidden)"), summary
    assert "table#bare" in found, summary
    assert "page" in found, summary  # the bare table widens the page, and the report names what sticks out
    assert "sticking out: td" in found["page"] and 'under "Widens the page"' in found["page"], summary
    assert not any(k in found for k in ("table#scrolls", "div.wrap")), summary
    assert not report["ok"]

    # at 1280 px nothing may scroll sideways, not even in its own box
    wide = check_site(site, tmp_path / "shots1280", pages=("index.html",), chromium=chromium, timeout_s=30)
    assert wide["width"] == 1280
    assert [o["element"].split(" ")[0] for o in wide["pages"]["index.html"]["overflow"]] == ["table#scrolls"], \
        format_report(wide)

    # the command line checks both widths; the 390 px screenshots go in OUT/390px
    out = tmp_path / "cli"
    assert main([str(site), "--out", str(out), "--page", "index.html"]) == 1  # 1280 fails, 390 passes
    assert (out / "index.png").is_file() and (out / "390px" / "index.png").is_file()
    assert main([str(site), "--out", str(out), "--page", "index.html", "--width", "390"]) == 0


_LINKS_PAGE = """<!doctype html>
<html><head><title>Links</title></head>
<body><nav><a href="index.html">Home</a> <a href="gone/index.html">Gone section</a></nav>
<main><article id="top">
<h2 id="sec-a">Links</h2>
<p><a id="ok1" href="other.html">other page</a>, <a href="other.html#results">its results</a>,
<a href="other.html#no-such-id">a stale anchor</a>, <a href="missing.html">a missing page</a>,
<a href="#sec-a">this section</a>, <a href="#gone-here">a gone section here</a>,
<a href="sub/">a folder</a>, <a href="_images/fig.png">a figure</a>,
<a href="https://example.org/x.html">elsewhere</a>, <a href="mailto:a@b.c">mail</a>,
<a href="other%20page.html#caf%C3%A9">an escaped one</a>.</p>
</article></main></body></html>
"""


def _links_site(tmp_path):
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "_images").mkdir()
    (site / "_images" / "fig.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (site / "sub" / "index.html").write_text("<!doctype html><title>Sub</title><p>sub</p>")
    (site / "other.html").write_text("<!doctype html><title>Other</title><section id=\"results\"><p>r</p></section>")
    (site / "other page.html").write_text("<!doctype html><title>Other 2</title><span id=\"café\"></span>")
    (site / "index.html").write_text(_LINKS_PAGE)
    return site


def test_broken_links_from_files(tmp_path):
    """The resolver alone, on the links a page reports: files, folders, anchors, escapes; other hosts are not judged."""
    from tools.sitecheck import broken_links

    site = _links_site(tmp_path)
    base = "http://127.0.0.1:1234/"
    hrefs = ["other.html", "other.html#results", "other.html#no-such-id", "missing.html", "sub/",
             "_images/fig.png", "https://example.org/x.html", "mailto:a@b.c", "other%20page.html#caf%C3%A9",
             "index.html#top", "index.html#nope", "other.html#results"]
    links = [[h, h if ":" in h.split("/")[0] else base + h, "w"] for h in hrefs]
    bad = broken_links(links, base, site)
    assert [b["href"] for b in bad] == ["other.html#no-such-id", "missing.html", "index.html#nope"], bad
    assert "no element with id 'no-such-id' in other.html" in bad[0]["why"]
    assert bad[1]["why"] == "no file missing.html"


def test_every_internal_link_resolves(chromium, tmp_path):
    from tools.sitecheck import check_site, format_report

    site = _links_site(tmp_path)
    report = check_site(site, tmp_path / "shots", pages=("index.html",), chromium=chromium, timeout_s=30)
    summary = format_report(report)
    r = report["pages"]["index.html"]
    broken = {b["href"]: b for b in r["broken_links"]}
    assert set(broken) == {"gone/index.html", "other.html#no-such-id", "missing.html", "#gone-here"}, summary
    assert broken["gone/index.html"]["element"] == 'in the navigation: "Gone section"', summary
    assert 'under "Links"' in broken["missing.html"]["element"], summary
    assert r["n_links"] == 13 and r["external"] == [], summary  # a link is not a request
    assert not report["ok"] and "link:     index.html: missing.html (no file missing.html)" in summary, summary


_JUNK_PAGE = """<!doctype html>
<html><head><title>Junk</title></head><body><main><article>
<h2>Setup</h2>
<p id="todo">TODO: write the conclusion.</p>
<p id="unset">Repository: not yet set.</p>
<p id="issue">This table was added for issue #26.</p>
<p id="lent">We measured it on a GPU lent to us for 30 minutes.</p>
<ul><li id="repourl">Set repo_url in _config.yml to get a link.</li></ul>
<div class="cell_input"><pre># TODO in the author's code is not the reader's text</pre></div>
</article></main></body></html>
"""

_NOT_JUNK_PAGE = """<!doctype html>
<html><head><title>Not junk</title></head><body><main><article>
<h2>Results</h2>
<p>The to-do list of the paper's authors; issues of scale; the tissue #3 of an example is not a number.</p>
<p>Set the seed before the run; nothing else is set yet.</p>
</article></main></body></html>
"""


def test_placeholder_and_work_log_text_is_junk(chromium, tmp_path):
    from tools.sitecheck import check_site, format_report

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(_NOT_JUNK_PAGE)
    (site / "junk.html").write_text(_JUNK_PAGE)
    report = check_site(site, tmp_path / "shots", chromium=chromium, timeout_s=30)
    summary = format_report(report)
    assert report["pages"]["index.html"]["junk"] == [], summary
    found = {j["element"].split(" ")[0] for j in report["pages"]["junk.html"]["junk"]
             if j["kind"] == "placeholder or work-log text"}
    assert found == {"p#todo", "p#unset", "p#issue", "p#lent", "li#repourl"}, summary


_BOOK_STYLE_PAGE = """<!doctype html>
<html><head><title>Book style</title><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="_static/ctrls.css"><script src="_static/ctrls-wbr.js"></script>
<style>body {{ margin: 0; }} article {{ display: block; max-width: 900px; }}</style></head>
<body><main><article class="bd-article">
<h2>Where each piece lives</h2>
<table><tr><th>paper</th><th>code</th><th>test</th><th>tag</th></tr>{rows}</table>
<p>Results are in <code class="docutils literal"><span class="pre">\
bench/results/gpu_estimate_measured_nvidia_h200_qwen.json</span></code>.</p>
</article></main></body></html>
"""
_ROW = ("<tr><td>Eq. {i}, spectrum embedding</td>"
        "<td><code class='docutils literal'><span class='pre'>"
        "ctrls/method/spectral.py::spectral_embeddings_{i}</span></code></td>"
        "<td><code class='docutils literal'><span class='pre'>"
        "tests/method/test_spectral.py::test_batched_equals_per_step_across_chunks_and_keeps_order</span></code></td>"
        "<td><code class='docutils literal'><span class='pre'>Sec. 5.2</span></code></td>"
        "<td style='white-space: nowrap'>mean reference steps over the whole split, nowrap as in a notebook's table</td></tr>")

# every text piece of a code name (between the <wbr>s ctrls-wbr.js puts in) on one line: no break inside a word
_SPLIT_WORDS = r"""() => {
  const bad = [];
  for (const code of document.querySelectorAll('article code.literal')) {
    const w = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    while (w.nextNode()) {
      const t = w.currentNode;
      for (const m of t.nodeValue.matchAll(/\S+/g)) {  // a space is a word's end: a break there is fine
        const r = document.createRange();
        r.setStart(t, m.index);
        r.setEnd(t, m.index + m[0].length);
        const tops = new Set(Array.from(r.getClientRects()).filter((x) => x.width > 0).map((x) => Math.round(x.top)));
        if (tops.size > 1) bad.push(m[0]);
      }
    }
  }
  return bad;
}"""


def test_the_books_css_wraps_code_names_between_words_and_scrolls_wide_tables_at_390(chromium, tmp_path):
    """The method page: with book/_static's ctrls.css and ctrls-wbr.js, the
    index's long code names break only after '/', '::', '.', '_' (never mid-word, never inside 5.2),
    and at 390 px the index table scrolls inside its own box: the check passes at both widths."""
    import shutil
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    from tools.sitecheck import CHROMIUM_ARGS, check_site, format_report, serve

    static = Path(__file__).resolve().parents[2] / "book" / "_static"
    site = tmp_path / "site"
    shutil.copytree(static, site / "_static")
    (site / "index.html").write_text(_BOOK_STYLE_PAGE.format(rows="".join(_ROW.format(i=i) for i in range(4))))
    for width in (1280, 390):
        report = check_site(site, tmp_path / f"shots{width}", chromium=chromium, timeout_s=30, width=width)
        assert report["ok"], format_report(report)
    with serve(site) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for width in (1280, 390):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(base + "index.html", wait_until="load")
                assert page.evaluate("() => document.querySelectorAll('article code.literal wbr').length") > 20
                assert page.evaluate(_SPLIT_WORDS) == [], width
                page.close()
        finally:
            browser.close()
