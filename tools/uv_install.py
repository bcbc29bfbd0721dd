"""`uv pip install` into this interpreter's environment, with pip's own settings; pip where uv fails.

`make` installs with uv, which is several times faster than pip on a cold cache, and must install
what pip would. uv does not read pip's configuration, so this reads `pip config list` (config files
and PIP_* variables) and passes on the settings that choose packages: index URLs, find-links and
constraints. uv is told to pick the best version across all indexes, as pip does (uv's default
takes the first index that has a package). Where uv cannot be installed (``pip install uv``), pip's
settings cannot be read, or uv fails, the same install runs with pip (``--no-compile``: the byte-code
is written where make keeps it), and stderr says so. Standard library only: it runs before anything
else is installed.

Usage: python tools/uv_install.py ARGS...   (ARGS as for `pip install`, e.g. -e ".[dev]")
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# pip's key -> uv's flag. Other keys (cert, timeout, version checks) do not choose packages.
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint", "no-index": "--no-index"}
TRUE = ("1", "true", "yes", "on")


def uv_flags(listing: str) -> list[str]:
    """uv's flags for the lines of `pip config list` (``section.key='value'``, ``:env:.key='value'``;
    a value may hold several space-separated entries, as pip allows)."""
    seen: dict[str, list[str]] = {}
    for line in listing.splitlines():
        name, eq, value = line.partition("=")
        key = name.rsplit(".", 1)[-1].strip()
        if not eq or key not in FLAGS:
            continue
        for v in " ".join(shlex.split(value)).split():
            if v not in seen.setdefault(key, []):
                seen[key].append(v)
    out = ["--index-strategy", "unsafe-best-match"]
    for key, values in seen.items():
        if key == "no-index":
            out += [FLAGS[key]] if values[-1].lower() in TRUE else []
        else:
            for v in values[-1:] if key == "index-url" else values:  # one default index: the last one set
                out += [FLAGS[key], v]
    return out


def uv_command(argv: list[str]) -> list[str] | None:
    """The `uv pip install` command for ``argv`` (uv installed into this environment first when it is
    not there), or None, saying why on stderr, where uv or pip's settings are not to be had."""
    here = str(Path(sys.executable).parent)
    if shutil.which("uv", path=here) is None and subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "uv"]).returncode != 0:
        print("uv_install: `pip install uv` failed", file=sys.stderr)
        return None
    uv = shutil.which("uv", path=here)
    if uv is None:
        print(f"uv_install: uv is not in {here}", file=sys.stderr)
        return None
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if listing.returncode != 0:
        print(f"uv_install: `pip config list` failed: {listing.stderr.strip()}", file=sys.stderr)
        return None
    return [uv, "pip", "install", "-q", "--python", sys.executable, *uv_flags(listing.stdout), *argv]


def main(argv: list[str]) -> int:
    cmd = uv_command(argv)
    if cmd is not None and subprocess.run(cmd).returncode == 0:
        return 0
    print(f"uv_install: installing {' '.join(argv)} with pip", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", *argv]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
