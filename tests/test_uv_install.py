"""tools/uv_install.py: `make`'s set-up installs with uv, which must see the package-choosing settings
of pip's configuration (uv does not read it): the machine's find-links hold the CPU build of torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import uv_install  # noqa: E402
from uv_install import uv_flags  # noqa: E402

# `pip config list` on these machines: environment variables (":env:") and config files ("global.")
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def pairs(flags: list[str]) -> list[tuple[str, str]]:
    """(flag, value) after the index strategy."""
    return list(zip(flags[2::2], flags[3::2]))


def test_the_machines_settings_become_uvs_flags():
    f = uv_flags(LISTING)
    assert f[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's choice: the best version of any index
    assert sorted(pairs(f)) == sorted([("--find-links", "/opt/wheels"),  # once, though set twice
                                       ("--constraint", "/etc/xdg/pip/constraints.txt"),
                                       ("--extra-index-url", "file:///opt/pypi/simple"),
                                       ("--extra-index-url", "file:///opt/pypi-more/simple")])
    assert not any("cert" in x or "180" in x for x in f)  # settings that choose no package stay out


def test_one_default_index_and_no_index():
    f = uv_flags("global.index-url='https://a.example/simple'\nuser.index-url='https://b.example/simple'\n"
                 "install.no-index='true'\n")
    assert f.count("--index-url") == 1 and f[f.index("--index-url") + 1] == "https://b.example/simple"
    assert "--no-index" in f
    assert "--no-index" not in uv_flags("install.no-index='false'\n")


def test_nothing_configured_is_only_the_strategy():
    assert uv_flags("") == ["--index-strategy", "unsafe-best-match"]


@pytest.mark.parametrize("uv_fails", ["listing", "install"])
def test_pip_runs_the_same_install_where_uv_fails(monkeypatch, uv_fails):
    """Where pip's settings cannot be read, or uv's install fails, the install runs with pip instead."""
    ran = []

    def run(cmd, **kw):
        ran.append(cmd)
        fail = (uv_fails == "listing" and cmd[-2:] == ["config", "list"]) or (uv_fails == "install" and cmd[0] == "/x/uv")
        return subprocess.CompletedProcess(cmd, 1 if fail else 0, stdout="", stderr="")

    monkeypatch.setattr(uv_install.shutil, "which", lambda name, path=None: "/x/uv")
    monkeypatch.setattr(uv_install.subprocess, "run", run)
    assert uv_install.main(["--no-deps", "pkg==1"]) == 0
    assert ran[-1] == [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "pkg==1"]
    assert any(c[0] == "/x/uv" for c in ran) == (uv_fails == "install")


def test_uv_alone_where_it_works(monkeypatch):
    ran = []
    monkeypatch.setattr(uv_install.shutil, "which", lambda name, path=None: "/x/uv")
    monkeypatch.setattr(uv_install.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0, stdout="", stderr=""))
    assert uv_install.main(["pkg==1"]) == 0
    assert ran[-1][:3] == ["/x/uv", "pip", "install"] and ran[-1][-1] == "pkg==1"
    assert not any("pip" in c and "--no-compile" in c for c in ran)
