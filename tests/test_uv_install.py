"""tools/uv_install.py: `make`'s set-up installs with uv, which must see the package-choosing settings
of pip's configuration (uv does not read it): the machine's find-links hold the CPU build of torch."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
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
    return [(f, v) for f, v in zip(flags[2:], flags[3:])][::2]


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
