"""What the studies' argument tests share: a study script loaded as a module, and its one-line refusal."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_study(name: str):
    """``studies/<name>.py`` as a module (the studies are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"study_{name}", ROOT / "studies" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def refused(main, argv) -> str:
    """The message ``main(argv)`` exits with: one line, no traceback."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and "\n" not in msg and "Traceback" not in msg, msg
    return msg
