"""Issue 49, item 5: ``--width`` is a window width, checked by argparse.

``python -m tools.sitecheck --width 0`` opened a 0 px window, where every table "overflows", and
reported the book as broken. A width that is not a whole number of px from ``MIN_WIDTH`` to
``MAX_WIDTH`` is now argparse's one-line error (exit status 2) before anything runs, and
``check_site`` refuses it (and a timeout that is not positive: Playwright reads 0 as none) before
it starts a browser. No browser is needed here.
"""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("width", ["0", "-390", "12", "100000", "390px", "1e3", ""])
def test_a_width_that_is_no_window_is_a_one_line_usage_error(width, tmp_path, capsys):
    from tools.sitecheck import main

    with pytest.raises(SystemExit) as e:  # argparse's exit, before any site is looked at
        main([str(tmp_path / "nosite"), "--out", str(tmp_path / "out"), "--width", width])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert err[-1].startswith("python -m tools.sitecheck: error: argument --width: "), err
    assert repr(width) in err[-1] or f"{width} px" in err[-1], err
    assert not any("Traceback" in ln for ln in err), err
    assert not (tmp_path / "out").exists()


def test_widths_that_are_windows_are_taken(tmp_path, capsys):
    from tools.sitecheck import MAX_WIDTH, MIN_WIDTH, main

    for w in (MIN_WIDTH, 390, 1280, MAX_WIDTH):  # valid: the site's absence is what stops them
        assert main([str(tmp_path / "nosite"), "--width", str(w)]) == 2
        assert "no index.html" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs,match", [({"width": 0}, "width 0"), ({"width": -5}, "width -5"),
                                          ({"width": 390.5}, "width 390.5"), ({"width": True}, "width True"),
                                          ({"timeout_s": 0}, "timeout_s 0"), ({"timeout_s": -1.0}, "timeout_s -1")])
def test_check_site_refuses_them_before_the_browser(tmp_path, kwargs, match):
    from tools.sitecheck import check_site

    (tmp_path / "index.html").write_text("<!doctype html><title>i</title>")
    with pytest.raises(ValueError, match=match):
        check_site(tmp_path, tmp_path / "shots", chromium="/nonexistent/chromium", **kwargs)
