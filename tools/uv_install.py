"""`uv pip install` into this interpreter's environment, with pip's own settings; pip where uv fails.

`make` installs with uv, which is several times faster than pip on a cold cache, and must install
what pip would. uv does not read pip's configuration, so this reads `pip config list` (config files
and PIP_* variables) and passes on, as pip would read them, the settings that choose what is installed:
index URLs and find-links (in uv's environment: a URL's password is not to be seen in `ps`), constraints,
wheels only or sdists only, hashes, pre-releases, build isolation. uv is told to pick the best version
across all indexes, as pip does (uv's default takes the first index that has a package), and to read
no configuration of its own. Where a setting has no uv equivalent (prefer-binary, upgrade, user, ...),
uv cannot be installed (``pip install uv``) or run, pip's settings cannot be read, or uv fails, the same
install runs with pip (``--no-compile``: the byte-code is written where make keeps it), and stderr says
so. Standard library only: it runs before anything else is installed.

Usage: python tools/uv_install.py ARGS...   (ARGS as for `pip install`, e.g. -e ".[dev]")
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The sections of pip's configuration that `pip install` reads, in pip's order, the last winning:
# PIP_* variables over [install] over [global], whichever file each comes from (`pip config list` has
# already let the file that wins within a section win: the site's over the user's over the global one).
# Other commands' sections ([download], [wheel]) are not read.
SECTIONS = ("global", "install", ":env:")

# pip install's options that choose what it installs, by setting: (pip's attribute, how pip reads it).
# "bool": pip's true/false words, stored as read, so that `no-build-isolation = no` turns isolation off
# (pip's own inversion for its --no-* options); "list": whitespace-separated, the source that wins
# replacing the others wholesale; "str": one value; "binary": pip's format control, each source applied
# on top of the one before. Settings not named here choose nothing (cert, timeout, cache, verbosity, ...).
OPTIONS = {
    "index-url": ("index_url", "str"), "extra-index-url": ("extra_index_urls", "list"),
    "find-links": ("find_links", "list"), "no-index": ("no_index", "bool"),
    "constraint": ("constraints", "list"), "requirement": ("requirements", "list"),
    "no-deps": ("ignore_dependencies", "bool"), "pre": ("pre", "bool"), "require-hashes": ("require_hashes", "bool"),
    "no-build-isolation": ("build_isolation", "bool"), "force-reinstall": ("force_reinstall", "bool"),
    "no-binary": ("no_binary", "binary"), "only-binary": ("only_binary", "binary"),
    # no uv equivalent (PIP_ONLY): pip installs where one is set
    "prefer-binary": ("prefer_binary", "bool"), "upgrade": ("upgrade", "bool"),
    "ignore-installed": ("ignore_installed", "bool"), "ignore-requires-python": ("ignore_requires_python", "bool"),
    "user": ("use_user_site", "bool"), "no-user": ("use_user_site", "bool"),
    "use-pep517": ("use_pep517", "bool"), "no-use-pep517": ("no_use_pep517", "str"),
    "check-build-dependencies": ("check_build_deps", "bool"), "dry-run": ("dry_run", "bool"),
    "report": ("report", "str"), "target": ("target", "str"), "prefix": ("prefix", "str"), "root": ("root", "str"),
    "platform": ("platform", "list"), "python-version": ("python_version", "str"),
    "implementation": ("implementation", "str"), "abi": ("abi", "list"), "editable": ("editable", "list"),
    "global-option": ("global_option", "list"), "config-settings": ("config_settings", "str"),
    "use-deprecated": ("use_deprecated", "list"),
}
# the attributes above that uv cannot honour when set (true, or any value); use-pep517 when false
PIP_ONLY = ("prefer_binary", "upgrade", "ignore_installed", "ignore_requires_python", "use_user_site", "no_use_pep517",
            "check_build_deps", "dry_run", "report", "target", "prefix", "root", "platform", "python_version",
            "implementation", "abi", "editable", "global_option", "config_settings", "use_deprecated")
# uv's settings from its environment that choose nothing; the others (UV_INDEX, UV_PRERELEASE, ...) would
# make uv install what pip would not, and are dropped
UV_KEEP = ("UV_CACHE_DIR", "UV_NO_CACHE", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_HTTP_RETRIES", "UV_LINK_MODE",
           "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_BUILDS", "UV_CONCURRENT_INSTALLS", "UV_NO_PROGRESS")


def strtobool(value: str) -> bool:
    """pip's reading of a true/false setting; ValueError for other words (pip stops on them)."""
    if value.lower() in ("y", "yes", "t", "true", "on", "1"):
        return True
    if value.lower() in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"{value!r} is not a true/false word")


def exclude(value: str, target: set[str], other: set[str]) -> None:
    """pip's FormatControl.handle_mutual_excludes: ``value`` (names, :all:, :none:, comma-separated)
    into ``target`` (no-binary's or only-binary's set), each name leaving ``other``."""
    if value.startswith("-"):
        raise ValueError(f"{value!r} is not a package name")  # pip stops on it
    new = value.split(",")
    while ":all:" in new:
        other.clear()
        target.clear()
        target.add(":all:")
        del new[:new.index(":all:") + 1]
        if ":none:" not in new:  # without a :none:, :all: covers the rest
            return
    for name in new:
        if name == ":none:":
            target.clear()
            continue
        name = re.sub(r"[-_.]+", "-", name).lower()  # PEP 503's normal form, as pip's canonicalize_name
        other.discard(name)
        target.add(name)


def apply(options: dict, section: str, items: list[tuple[str, str]]) -> dict:
    """``options`` (a copy) with one section's ``items`` (key, value) on top, as pip sets them."""
    options = {**options, "no_binary": set(options["no_binary"]), "only_binary": set(options["only_binary"])}
    for key, value in items:
        name, kind = OPTIONS[key]
        try:
            if kind == "bool":
                options[name] = strtobool(value)
            elif kind == "list":
                options[name] = value.split()  # replaces the lower source's list
            elif kind == "binary":
                exclude(value, options[name], options["only_binary" if name == "no_binary" else "no_binary"])
            else:
                options[name] = value
        except ValueError as e:
            raise ValueError(f"pip's setting {section}.{key}: {e}") from None
    return options


def pip_options(listing: str) -> dict:
    """pip install's options (OPTIONS' attributes) from the lines of `pip config list` (``section.key='value'``,
    ``:env:.key='value'``), as pip sets them; ValueError where pip would stop on one, or where the order
    of one file's settings, which the listing does not keep, decides."""
    items: dict[str, list[tuple[str, str]]] = {s: [] for s in SECTIONS}
    for line in listing.splitlines():
        name, eq, value = line.partition("=")
        section, _, key = name.partition(".")  # ":env:.find-links": the section ":env:"
        if eq and section in items and key in OPTIONS:
            value = ast.literal_eval(value.strip())  # printed as Python's repr: quotes, "\n" of a file's lines
            if value:  # pip skips empty values (PIP_INDEX_URL=)
                items[section].append((key, value))
    options: dict = {"no_binary": set(), "only_binary": set()}
    for section in SECTIONS:
        first, last = (apply(options, section, items[section][::step]) for step in (1, -1))
        if first != last:  # two settings of one option (no-binary and only-binary, user and no-user): pip sets
            # them in the order of their file (of the environment), which `pip config list` does not keep
            keys = [k for k, _ in items[section] if first.get(OPTIONS[k][0]) != last.get(OPTIONS[k][0])]
            raise ValueError(f"pip's settings {section}.{' and '.join(keys)}: their order decides")
        options = first
    return options


def uv_settings(listing: str) -> tuple[list[str], dict[str, str]]:
    """uv's flags and environment variables for the lines of `pip config list`; ValueError naming the
    setting where pip would stop, or uv cannot do what pip would."""
    options = pip_options(listing)
    unable = [n for n in PIP_ONLY if options.get(n)] + (["use_pep517"] if options.get("use_pep517") is False else [])
    if unable:
        keys = [k for k, (n, _) in OPTIONS.items() if n in unable]
        raise ValueError(f"pip's setting {', '.join(keys)}: uv has no equivalent")
    flags = ["--no-config", "--index-strategy", "unsafe-best-match"]  # pip's choice: the best version of any index
    env = {}
    if "index_url" in options:
        env["UV_DEFAULT_INDEX"] = options["index_url"]
    if options.get("extra_index_urls"):
        env["UV_INDEX"] = " ".join(options["extra_index_urls"])  # uv splits it at spaces
    if options.get("find_links"):
        if any("," in x for x in options["find_links"]):
            raise ValueError("pip's setting find-links: a comma in a location (uv splits UV_FIND_LINKS at commas)")
        env["UV_FIND_LINKS"] = ",".join(options["find_links"])
    flags += ["--no-index"] if options.get("no_index") else []
    for name, flag in (("constraints", "--constraint"), ("requirements", "--requirement")):
        for path in options.get(name, []):
            flags += [flag, path]
    flags += ["--no-deps"] if options.get("ignore_dependencies") else []
    flags += ["--prerelease", "allow"] if options.get("pre") else []
    flags += ["--require-hashes"] if options.get("require_hashes") else []
    flags += ["--no-build-isolation"] if options.get("build_isolation") is False else []
    flags += ["--reinstall"] if options.get("force_reinstall") else []
    for name in ("no_binary", "only_binary"):
        for package in sorted(options[name]):  # uv, as pip: a name in one list over :all: in the other
            flags += ["--" + name.replace("_", "-"), package]
    return flags, env


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    """This process's environment for uv: its own settings that choose packages dropped, ``settings`` added."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_KEEP} | settings


def uv_command(argv: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """The `uv pip install` command for ``argv`` and its environment (uv installed into this environment
    first when it is not there), or None, saying why on stderr, where uv or pip's settings are not to be had
    or uv cannot install as pip would."""
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if listing.returncode != 0:
        print(f"uv_install: `pip config list` failed: {listing.stderr.strip()}", file=sys.stderr)
        return None
    try:
        flags, env = uv_settings(listing.stdout)
    except (ValueError, SyntaxError) as e:  # SyntaxError: a line `pip config list` did not write as expected
        print(f"uv_install: {e}", file=sys.stderr)
        return None
    here = str(Path(sys.executable).parent)
    if shutil.which("uv", path=here) is None and subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "uv"]).returncode != 0:
        print("uv_install: `pip install uv` failed", file=sys.stderr)
        return None
    uv = shutil.which("uv", path=here)
    if uv is None:
        print(f"uv_install: uv is not in {here}", file=sys.stderr)
        return None
    return [uv, "pip", "install", "-q", "--python", sys.executable, *flags, *argv], uv_environment(env)


def main(argv: list[str]) -> int:
    got = uv_command(argv)
    if got is not None:
        try:
            if subprocess.run(got[0], env=got[1]).returncode == 0:
                return 0
        except OSError as e:  # uv not to be run: gone, not executable, a bad interpreter line
            print(f"uv_install: cannot run uv: {e}", file=sys.stderr)
    print(f"uv_install: installing {' '.join(argv)} with pip", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", *argv]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
