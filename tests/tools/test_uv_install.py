"""tools/uv_install.py: `make`'s set-up installs with uv, which must install what pip would with pip's
settings (uv does not read them): the machine's find-links hold the CPU build of torch."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import uv_install  # noqa: E402
from uv_install import uv_settings  # noqa: E402

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
STRATEGY = ["--no-config", "--index-strategy", "unsafe-best-match"]


def pairs(flags: list[str]) -> list[tuple[str, str]]:
    """(flag, value) after uv's fixed flags."""
    return list(zip(flags[3::2], flags[4::2]))


def test_the_machines_settings_reach_uv():
    flags, env = uv_settings(LISTING)
    assert flags == STRATEGY + ["--constraint", "/etc/xdg/pip/constraints.txt"]  # the best version of any index, as pip
    assert env == {"UV_FIND_LINKS": "/opt/wheels",  # the environment's, which pip takes over the file's
                   "UV_INDEX": "file:///opt/pypi/simple file:///opt/pypi-more/simple"}
    assert not any("cert" in x or "180" in x for x in flags + list(env.values()))  # they choose no package


def test_nothing_configured_is_only_the_strategy():
    assert uv_settings("") == (STRATEGY, {})


def test_the_environment_wins_then_install_then_global():
    """pip's order (`pip config list` prints by name, so the environment came first and lost)."""
    env_last = "global.index-url='https://g.example/simple'\ninstall.index-url='https://i.example/simple'\n"
    assert uv_settings(env_last)[1] == {"UV_DEFAULT_INDEX": "https://i.example/simple"}  # [install] over [global]
    listing = ":env:.index-url='https://e.example/simple'\n" + env_last
    assert uv_settings(listing)[1] == {"UV_DEFAULT_INDEX": "https://e.example/simple"}  # PIP_INDEX_URL over both
    unset = ":env:.index-url=''\n" + env_last  # PIP_INDEX_URL= : pip skips empty values
    assert uv_settings(unset)[1] == {"UV_DEFAULT_INDEX": "https://i.example/simple"}
    other = "download.no-index='yes'\nwheel.find-links='/w'\ndownload.only-binary=':all:'\n"  # other commands' sections
    assert uv_settings(other) == (STRATEGY, {})


@pytest.mark.parametrize("word", ["y", "Y", "t", "yes", "true", "on", "1", "TRUE"])
def test_pips_true_words(word):
    assert "--no-index" in uv_settings(f":env:.no-index='{word}'\n")[0]


@pytest.mark.parametrize("word", ["n", "f", "no", "false", "off", "0"])
def test_pips_false_words_and_the_environment_turns_a_files_setting_off(word):
    assert "--no-index" not in uv_settings(f":env:.no-index='{word}'\nglobal.no-index='yes'\n")[0]


def test_a_word_pip_refuses_leaves_the_install_to_pip():
    with pytest.raises(ValueError):
        uv_settings(":env:.no-index='maybe'\n")


def test_find_links_of_the_environment_replace_the_files():
    """pip takes a list setting wholesale from the source that wins: uv must not look in the others."""
    flags, env = uv_settings(":env:.find-links='/e1 /e2'\nglobal.find-links='/g'\ninstall.extra-index-url='file:///i'\n"
                             "global.extra-index-url='file:///g1 file:///g2'\n")
    assert env == {"UV_FIND_LINKS": "/e1,/e2", "UV_INDEX": "file:///i"}
    assert uv_settings("global.find-links='\\n/x\\n/y'\n")[1] == {"UV_FIND_LINKS": "/x,/y"}  # a file's lines


def test_settings_that_restrict_the_install_reach_uv():
    flags, _ = uv_settings("global.require-hashes='yes'\nglobal.pre='on'\nglobal.no-deps='1'\n"
                           "global.no-build-isolation='no'\nglobal.force-reinstall='true'\n"
                           "install.requirement='/r.txt'\n")
    assert flags[:3] == STRATEGY
    assert sorted(flags[3:]) == sorted(["--require-hashes", "--prerelease", "allow", "--no-deps",
                                        "--no-build-isolation", "--reinstall", "--requirement", "/r.txt"])
    # pip reads `no-build-isolation` as the value of build isolation: `yes` keeps it
    assert "--no-build-isolation" not in uv_settings("global.no-build-isolation='yes'\n")[0]


@pytest.mark.parametrize("listing, no_binary, only_binary", [
    ("global.only-binary=':all:'\n", [], [":all:"]),
    ("global.no-binary='Foo_Bar,baz'\n", ["baz", "foo-bar"], []),
    # pip's format control: each source on top of the one before, a name in one list leaves the other
    ("global.only-binary=':all:'\ninstall.no-binary='foo'\n", ["foo"], [":all:"]),
    (":env:.only-binary=':all:'\nglobal.no-binary='foo'\n", [], [":all:"]),
    ("global.no-binary='foo,bar'\n:env:.only-binary='foo'\n", ["bar"], ["foo"]),
    ("global.no-binary=':all:'\n:env:.no-binary=':none:'\n", [], []),
])
def test_binary_settings_reach_uv(listing, no_binary, only_binary):
    flags = uv_settings(listing)[0]
    assert sorted(v for f, v in pairs(flags) if f == "--no-binary") == no_binary
    assert sorted(v for f, v in pairs(flags) if f == "--only-binary") == only_binary


def test_settings_whose_order_in_one_file_decides_leave_the_install_to_pip():
    """pip applies a file's no-binary and only-binary in the file's order, which `pip config list` does not keep."""
    with pytest.raises(ValueError, match="order decides"):
        uv_settings("global.no-binary='foo'\nglobal.only-binary=':all:'\n")
    with pytest.raises(ValueError, match="order decides"):
        uv_settings(":env:.user='yes'\n:env:.no-user='no'\n")
    assert uv_settings("global.no-binary='foo'\nglobal.only-binary='bar'\n")[0][3:] == ["--no-binary", "foo",
                                                                                     "--only-binary", "bar"]


@pytest.mark.parametrize("on, off", [
    ("global.prefer-binary='yes'", "global.prefer-binary='no'"),
    (":env:.upgrade='1'", ":env:.upgrade='0'"),
    ("global.user='t'", "global.user='f'"),
    ("global.no-user='y'", "global.no-user='n'"),  # pip's inversion: `no-user = y` installs into the user's site
    ("install.use-pep517='no'", "install.use-pep517='yes'"),
    ("global.ignore-requires-python='on'", "global.ignore-requires-python='off'"),
    ("global.dry-run='yes'", "global.dry-run='no'"),
    ("global.target='/t'", ""),
    ("global.use-deprecated='legacy-resolver'", ""),
])
def test_settings_uv_cannot_honour_leave_the_install_to_pip(on, off):
    with pytest.raises(ValueError, match=on.split(".")[1].split("=")[0]):
        uv_settings(on + "\n")
    assert uv_settings(off + "\n") == (STRATEGY, {})  # switched off, uv can


def test_credentials_stay_off_uvs_command_line(monkeypatch):
    """An index URL with a password is seen by any user in `ps`: uv gets the URLs in its environment."""
    secret = "https://me:s3cret@i.example/simple"
    listing = (f"global.index-url='{secret}'\nglobal.extra-index-url='https://u:pw@x.example/simple'\n"
               "global.find-links='https://u:pw@f.example/'\n")
    ran = []
    monkeypatch.setattr(uv_install.shutil, "which", lambda name, path=None: "/x/uv")
    monkeypatch.setattr(uv_install.subprocess, "run", lambda cmd, **kw: ran.append((cmd, kw))
                        or subprocess.CompletedProcess(cmd, 0, stdout=listing, stderr=""))
    monkeypatch.setenv("UV_INDEX_URL", "https://elsewhere.example/simple")  # uv's own settings would add indexes
    assert uv_install.main(["pkg==1"]) == 0
    cmd, kw = ran[-1]
    assert cmd[0] == "/x/uv" and not any("pw" in x or "s3cret" in x for x in cmd)
    assert kw["env"]["UV_DEFAULT_INDEX"] == secret and "UV_INDEX_URL" not in kw["env"]
    assert kw["env"]["UV_INDEX"] == "https://u:pw@x.example/simple"
    assert kw["env"]["UV_FIND_LINKS"] == "https://u:pw@f.example/"
    assert kw["env"]["PATH"] == os.environ["PATH"]


def fake_run(ran: list, listing: str = "", fail: str = ""):
    """subprocess.run: `pip config list` prints ``listing``; the command that starts with ``fail`` exits 1."""
    def run(cmd, **kw):
        ran.append(cmd)
        if cmd[0] == "/x/uv" and fail == "oserror":
            raise FileNotFoundError(2, "No such file or directory", "/x/uv")
        bad = (fail == "listing" and cmd[-2:] == ["config", "list"]) or (fail == "install" and cmd[0] == "/x/uv")
        return subprocess.CompletedProcess(cmd, 1 if bad else 0, stdout=listing, stderr="")
    return run


PIP = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "pkg==1"]


@pytest.mark.parametrize("uv_fails", ["listing", "install", "oserror"])
def test_pip_runs_the_same_install_where_uv_fails(monkeypatch, uv_fails):
    """Where pip's settings cannot be read, or uv fails or cannot be run at all, the install runs with pip."""
    ran = []
    monkeypatch.setattr(uv_install.shutil, "which", lambda name, path=None: "/x/uv")
    monkeypatch.setattr(uv_install.subprocess, "run", fake_run(ran, fail=uv_fails))
    assert uv_install.main(["--no-deps", "pkg==1"]) == 0
    assert ran[-1] == PIP
    assert any(c[0] == "/x/uv" for c in ran) == (uv_fails != "listing")


@pytest.mark.parametrize("listing", ["global.prefer-binary='yes'\n", ":env:.no-index='maybe'\n"])
def test_pip_installs_where_uv_cannot_honour_a_setting(monkeypatch, capsys, listing):
    ran = []
    monkeypatch.setattr(uv_install.shutil, "which", lambda name, path=None: "/x/uv")
    monkeypatch.setattr(uv_install.subprocess, "run", fake_run(ran, listing))
    assert uv_install.main(["--no-deps", "pkg==1"]) == 0
    assert ran[-1] == PIP and not any(c[0] == "/x/uv" for c in ran)
    assert listing.split("=")[0].split(".")[1] in capsys.readouterr().err  # says which setting


def test_uv_alone_where_it_works(monkeypatch):
    ran = []
    monkeypatch.setattr(uv_install.shutil, "which", lambda name, path=None: "/x/uv")
    monkeypatch.setattr(uv_install.subprocess, "run", fake_run(ran, "global.only-binary=':all:'\n"))
    assert uv_install.main(["pkg==1"]) == 0
    assert ran[-1][:3] == ["/x/uv", "pip", "install"] and ran[-1][-3:] == ["--only-binary", ":all:", "pkg==1"]
    assert not any("pip" in c and "--no-compile" in c for c in ran)


# pip's and uv's resolution, side by side: the same config files and PIP_* variables, local find-links only

def wheel(where: Path, name: str, version: str, requires: str = "") -> None:
    """A pure-Python wheel of ``name`` (what a resolver reads: its file name and METADATA)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + (requires and f"Requires-Dist: {requires}\n")
    with zipfile.ZipFile(where / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        z.writestr(f"{dist}.dist-info/METADATA", meta)
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


def sdist(where: Path, name: str, version: str) -> None:
    """An sdist with static metadata (uv reads it unbuilt); its build needs a backend no index here has."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {"PKG-INFO": f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\n",
             "pyproject.toml": f'[build-system]\nrequires = ["no-such-backend"]\nbuild-backend = "nope"\n'
                               f'[project]\nname = "{name}"\nversion = "{version}"\n'}
    with tarfile.open(where / f"{dist}.tar.gz", "w:gz") as t:
        for fname, text in files.items():
            info = tarfile.TarInfo(f"{dist}/{fname}")
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))


SCENARIOS = {  # config files (the global one, the user's) and PIP_* variables; pip takes 1.0 from {old} in each
    "environment over file": ("", "[global]\nfind-links = {new}\n", {"PIP_FIND_LINKS": "{old}"}),
    "install over global": ("[install]\nfind-links = {old}\n", "[global]\nfind-links = {new}\n", {}),
    "only wheels": ("[global]\nonly-binary = :all:\n", "", {"PIP_FIND_LINKS": "{old} {sdists}", "PIP_NO_INDEX": "t"}),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_pip_and_uv_choose_the_same_versions(tmp_path, monkeypatch, scenario):
    if shutil.which("uv", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("uv is not installed in this environment")
    dirs = {d: tmp_path / d for d in ("old", "new", "sdists")}
    for d in dirs.values():
        d.mkdir()
    for where, version in (("old", "1.0"), ("new", "2.0")):
        wheel(dirs[where], "uvit-alpha", version, "uvit-beta")
        wheel(dirs[where], "uvit-beta", version)
    sdist(dirs["sdists"], "uvit-alpha", "3.0")
    global_conf, user_conf, variables = SCENARIOS[scenario]
    for var in [v for v in os.environ if v.startswith(("PIP_", "UV_"))]:
        monkeypatch.delenv(var)
    for conf, text in ((tmp_path / "etc/pip/pip.conf", global_conf), (tmp_path / "home/.config/pip/pip.conf", user_conf)):
        conf.parent.mkdir(parents=True)
        conf.write_text(text.format(**dirs))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc"))  # pip's global file
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home/.config"))  # the user's
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    for var, value in {"PIP_NO_INDEX": "1", **variables}.items():  # no index: these directories alone
        monkeypatch.setenv(var, value.format(**dirs))

    report = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--report", "-", "-q", "uvit-alpha"],
                            capture_output=True, text=True, check=True).stdout
    by_pip = {p["metadata"]["name"]: p["metadata"]["version"] for p in json.loads(report)["install"]}
    cmd, env = uv_install.uv_command(["--dry-run", "uvit-alpha"])
    out = subprocess.run([x for x in cmd if x != "-q"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    by_uv = dict(line.strip()[2:].split("==") for line in out.stderr.splitlines() if line.startswith(" + "))
    assert by_pip == {"uvit-alpha": "1.0", "uvit-beta": "1.0"}
    assert by_uv == by_pip
