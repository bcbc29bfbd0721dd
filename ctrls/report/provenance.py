"""What the book pages share: provenance banners and notes, and "paper vs ours" formatting.

A page says where its numbers come from once, at its top, never in its sentences: the banner
(:func:`provenance`: profile, backbone, data, seed, commit, device of this build's run) and, on a page
that also reads stored study results, one note (:func:`stored_note`): for each stored file, the commit
and the device it ran on, or that the file is not stored. No path outside the repository is
ever shown.
"""
from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import torch

from ctrls.config.overrides import parse_overrides
from ctrls.config.schema import Config, load_config
from ctrls.method.backbone import cpu_model, git_commit  # noqa: F401 (re-exported: ctrls.cli and the benches)
from ctrls.report.words import say

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
    # a relative run_dir is the repository's (a kernel's working directory is the notebook's folder, not the root)
    run_dir = str(Path(run_dir) if Path(run_dir).is_absolute() else (ROOT / run_dir).resolve())
    return load_config(profile, {**parse_overrides(overrides), "run_dir": run_dir})


def dtype_words(choice) -> str:
    """A backbone's dtype as a banner says it: "float32 (`backbone.dtype: device`, the device's default)",
    "bfloat16 (`backbone.dtype: auto`, by a probe: fp32 100.0 GFLOP/s, bf16 400.0 GFLOP/s)"; the logs and
    config.yaml keep ``DtypeChoice.describe``."""
    if choice.requested == choice.dtype:
        return choice.dtype
    p = choice.probe
    why = (say("banner", "dtype.cuda" if choice.device == "cuda" else "dtype.default") if p is None else
           say("banner", "dtype.probe", fp32=format(p.fp32_gflops, ".1f"), bf16=format(p.bf16_gflops, ".1f")))
    return say("banner", "dtype.key", dtype=choice.dtype, requested=choice.requested, why=why)


def provenance(cfg: Config, backbones: Iterable[str] | None = None, datasets: Iterable[str] | None = None,
               synthetic: bool = False) -> str:
    """A Markdown banner: backbone and its dtype (``backbone.dtype: auto``: the probe's choice and numbers),
    data, profile, seed, commit, hardware. ``synthetic``: the synthetic study's banner, which has no language
    model, no data set and no conditioning to name, only the chain's seeds."""
    from ctrls.report.display import and_list

    n = torch.get_num_threads()
    dev = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
           else say("banner", "device.cpu", cpu=platform.processor() or platform.machine(), threads=_plural(n, "thread")))
    commit, version = git_commit(), sys.modules["ctrls"].__version__
    code = "ctrls " + version if commit == "unknown" else say("banner", "code.commit", version=version, commit=commit)
    tail = say("banner", "tail", code=code, torch=torch.__version__, device=dev)
    if synthetic:
        seeds = cfg.synthetic.seeds
        return say("banner", "banner.synthetic", profile=cfg.profile, tail=tail,
                   seeds=("seed " if len(seeds) == 1 else "seeds ") + and_list(seeds))
    return say("banner", "banner", profile=cfg.profile, backbones=", ".join(backbones or cfg.grid.backbones),
               dtype=dtype_words(cfg.dtype_choice()), datasets=", ".join(datasets or cfg.grid.datasets),
               n_train=cfg.data.n_train, n_test=cfg.data.n_test, seed=cfg.seed, conditioning=conditioning(cfg), tail=tail)


def _plural(n: int, word: str) -> str:
    """"1 thread", "2 threads"."""
    return str(n) + " " + word + ("" if n == 1 else "s")


def conditioning_name(cfg: Config) -> str:
    """What conditions this run's CTRLS steps on their state, in two words: "the state prompt"
    (``state_prompt.use``, ``ctrls.method.state_prompt``) or "the adapter" (the paper's Eq. 8)."""
    return "the state prompt" if cfg.state_prompt.use else "the adapter"


def conditioning(cfg: Config) -> str:
    """:func:`conditioning_name` with its settings, for the pages' banner."""
    sp = cfg.state_prompt
    if not sp.use:
        return say("banner", "conditioning.adapter")
    mask = say("banner", "conditioning.mask", floor=format(cfg.grid.position_floor, "g")) if cfg.grid.position_floor > 0 else ""
    return say("banner", "conditioning.prompt", vectors=sp.vectors, mask=mask,
               adapter=say("banner", "conditioning.with adapter") if sp.with_adapter else "")


ROOT = Path(__file__).resolve().parents[2]


def _device(machine) -> str:
    """A stored result's machine record as a reader's words: "CPU (AMD EPYC, 1 thread)", "NVIDIA H200"."""
    if isinstance(machine, str):
        return machine or "—"
    if not isinstance(machine, dict) or not machine:
        return "—"
    if machine.get("gpu"):
        return str(machine["gpu"])
    cpu, threads = machine.get("cpu"), machine.get("threads")
    if not cpu:
        return "—"
    return say("banner", "device.cpu", cpu=cpu, threads=_plural(threads, "thread")) if threads else "CPU (" + str(cpu) + ")"


def stored_record(rel: str, root: Path = ROOT) -> dict:
    """{file, commit, device, stored} of one stored result (a JSON file of the repository, ``rel`` relative
    to its root): the commit (its own, or its environment's ``git_commit``, shortened) and machine it records
    (None where the file records no commit, "—" where it
    names no machine); ``stored`` False when the repository does not hold the file."""
    p = Path(root) / rel
    if not p.is_file():
        return {"file": rel, "commit": None, "device": "—", "stored": False}
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return {"file": rel, "commit": None, "device": "unreadable", "stored": True}
    d = d if isinstance(d, dict) else {}
    env = d.get("environment") if isinstance(d.get("environment"), dict) else {}
    commit = d.get("commit") or env.get("git_commit")  # a benchmark records its commit in its environment
    return {"file": rel, "commit": (str(commit)[:7] if re.fullmatch(r"[0-9a-f]{40}", str(commit)) else str(commit))
            if commit else None,
            "device": _device(d.get("machine") or d.get("environment") or {}), "stored": True}


STUDIES_INTRO = ("This build's own runs come from the commit in the banner above. The studies listed here were "
                 "run once and stored; the book reads them and does not rerun them.")


def stored_note(rels: Iterable[str] | dict[str, str], root: Path = ROOT, intro: str = STUDIES_INTRO) -> str:
    """The page's one note on the stored results it reads: a table of file, commit (where a file records
    one) and device, one row per file (a missing file says so in its row, and its section shows nothing). ``rels`` may
    map each file to the section that shows it (a column of its own); ``intro`` opens the note. "" when
    the page reads none."""
    where = dict(rels) if isinstance(rels, dict) else {}
    rows = [stored_record(r, root) for r in dict.fromkeys(rels)]
    if not rows:
        return ""
    commits = {r["commit"] for r in rows if r["stored"] and r["commit"]}
    lines = [say("banner", "stored.title"), "",
             intro + (say("banner", "stored.commits", commits=len(commits)) if len(commits) > 1 else ""), ""]
    # a commit column only where a stored file records its commit: a field no file records is left out
    cols = ["stored result"] + (["shown in"] if where else []) + (["commit"] if commits else []) + ["device"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"`{r['file']}`"] + ([where.get(r["file"], "")] if where else [])
        c = r["commit"] or "—"
        c = f"`{c}`" if re.fullmatch(r"[0-9a-f]{6,40}(\+dirty)?", c) else c
        if not r["stored"]:
            cells += [say("banner", "stored.missing")] + (["—"] if commits else [])
        else:
            cells += ([c] if commits else []) + [r["device"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [":::", ""])


def show_provenance(cfg: Config, page: str | int | None = None, stored: Iterable[str] = (), **kw) -> None:
    """The page's banner (:func:`provenance`) and, when it reads stored study results, their note
    (:func:`stored_note`). ``page`` (``"01_pretraining"``) numbers the page's figures "Figure B1.n"
    (``ctrls.report.plots.set_page``)."""
    from IPython.display import Markdown, display

    if page is not None:
        from ctrls.report import plots

        plots.set_page(page)
    display(Markdown("> " + provenance(cfg, **kw)))
    note = stored_note(stored)
    if note:
        display(Markdown(note))  # its cell renders Markdown as MyST (cell metadata mystnb.markdown_format)


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
