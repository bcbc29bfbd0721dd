"""What the book pages share: provenance banners and "paper vs ours" formatting."""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import torch

from ctrls.config.overrides import parse_overrides
from ctrls.config.schema import Config, load_config
from ctrls.method.backbone import cpu_model  # noqa: F401 (re-exported: ctrls.cli and the benches)

if TYPE_CHECKING:
    import pandas as pd


def notebook_config(profile: str = "demo", run_dir: str = "runs", overrides: str | Iterable[str] = ()) -> Config:
    """The config a notebook runs with, from its papermill parameters: ``overrides`` is a list of
    ``key=value`` items or one string of them, separated by whitespace outside brackets and quotes
    (``"grid.epsilons=[0.1, 0.3] rl.steps=3"``, see ``ctrls.config.schema.split_overrides``). In a kernel it
    also installs the book's table display (``ctrls.report.display``: whole tables, no default index,
    constant columns said once)."""
    from ctrls.report import display

    display.install()
    return load_config(profile, {**parse_overrides(overrides), "run_dir": run_dir})


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(cfg: Config, backbones: Iterable[str] | None = None, datasets: Iterable[str] | None = None) -> str:
    """A Markdown banner: backbone and its dtype (``backbone.dtype: auto``: the probe's choice and numbers),
    data, profile, seed, commit, hardware."""
    bb = ", ".join(backbones or cfg.grid.backbones)
    ds = ", ".join(datasets or cfg.grid.datasets)
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return (f"**Produced by** profile `{cfg.profile}` · backbone `{bb}`, {cfg.dtype_choice().describe()} · data `{ds}` "
            f"(n_train={cfg.data.n_train}, n_test={cfg.data.n_test}) · seed {cfg.seed} · "
            f"ctrls {sys.modules['ctrls'].__version__} at commit `{git_commit()}` · torch {torch.__version__} on {dev}")


def show_provenance(cfg: Config, **kw) -> None:
    from IPython.display import Markdown, display

    display(Markdown("> " + provenance(cfg, **kw)))


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def ci_decimals(lo: float, hi: float) -> int:
    """Decimals a value deserves beside its interval ``[lo, hi]`` (same unit): about a tenth of the
    interval's width, so 0 for a 10-point-wide interval or wider, 1 down to 1 point, 2 below.
    A zero-width or missing interval gets 1."""
    import math

    w = hi - lo
    if not (w > 0 and math.isfinite(w)):
        return 1
    return max(0, min(2, math.ceil(-math.log10(w / 10) - 1e-9)))


def pct_ci(v: float, lo: float, hi: float, digits: int | None = None) -> str:
    """``72 [60, 85]`` from fractions, in percent, rounded to what the interval supports
    (:func:`ci_decimals`: ``72.5 [70.1, 74.9]`` for a narrower one), or to ``digits`` decimals."""
    d = ci_decimals(100 * lo, 100 * hi) if digits is None else digits
    return f"{100 * v:.{d}f} [{100 * lo:.{d}f}, {100 * hi:.{d}f}]"


def column_decimals(lo, hi, scale: float = 100.0) -> int | None:
    """One number of decimals for a whole column of ``value [lo, hi]`` cells: the most that any of
    its intervals supports (:func:`ci_decimals`), so that a column never mixes roundings; None when
    no row has an interval."""
    import math

    ds = [ci_decimals(scale * a, scale * b) for a, b in zip(lo, hi)
          if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    return max(ds) if ds else None


def with_pct_ci(t, prefix: str = "") -> "pd.DataFrame":
    """``t`` with ``pass@n (%)`` and ``Succ. (%)`` columns, each ``value [lo, hi]`` in percent, from the
    ``pass@n``/``succ`` columns and their ``lo``/``hi`` confidence bounds (Tables 1 and 2)."""
    def col(v, lo, hi):  # one rounding per column (column_decimals)
        d = column_decimals(t[lo], t[hi])
        return [pct_ci(a, b, c, d) for a, b, c in zip(t[v], t[lo], t[hi])]

    return t.assign(**{f"{prefix}pass@n (%)": col("pass@n", "pass@n lo", "pass@n hi"),
                       f"{prefix}Succ. (%)": col("succ", "succ lo", "succ hi")})


def show_tables(tables: dict[str, "pd.DataFrame"]) -> None:
    """Display each table under its heading (in a notebook): the backbone and dataset go in the
    heading, not in every row, so wide tables fit the page."""
    from IPython.display import Markdown, display

    for heading, t in tables.items():
        display(Markdown(f"**{heading}**"))
        display(t)
