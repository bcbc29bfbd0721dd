"""Command line: ``ctrls reproduce`` (notebooks -> book) and the stages on their own.

    ctrls reproduce [--profile demo] [--only STAGE ...] [--force STAGE ...] [-o key=value ...]
    ctrls stage STAGE [STAGE ...] [--profile demo] [--force] [-o key=value ...]   # pretrain exploration rl
    ctrls verify-references [--dataset gsm8k] [--split test] [--math-verify]
    ctrls runs [--run-dir runs] [--profile demo]   # the stored runs, with their overrides, commit and time
    ctrls runs rm NAME                              # remove one (e.g. demo/exploration@3f9c0a1b2d4e5f60)
    ctrls profiles
    ctrls config --explain [KEY]   # what a config key means, its type, default and allowed values; no KEY: every key

Overrides are dotted ``key=value`` items with YAML values (``-o rl.steps=3 "grid.epsilons=[0.1, 0.3]"``).
A bad profile or override (``ctrls.config.schema.ConfigError``) is one line on stderr and exit status 2,
before any stage runs; data that cannot be loaded (``ctrls.data.problems.DataError``: an unknown dataset or
split, a missing file) is one line and exit status 1; so is a failed notebook (e.g. a table given no
samples). A ``--run-dir`` that is not a writable directory and an unknown ``CTRLS_LOG`` level are
one line and exit status 2, as is a directory under it that a stage cannot write (e.g. a read-only
profile directory), a full disk or a stage lock that is a symbolic link; a stage that another process is
writing is one line and exit status 1.

Several GPUs: ``accelerate launch --multi_gpu --num_processes 8 -m ctrls stage rl --profile paper``
runs a stage data-parallel (``ctrls.stages.distributed``); ``ctrls reproduce`` then reuses its results.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BOOK = ROOT / "book"
GENERATED = BOOK / "generated"

# stage name -> notebook, in the order they run
STAGES: dict[str, str] = {
    "setup": "00_setup_check.ipynb",
    "pretrain": "01_pretraining.ipynb",
    "exploration": "02_exploration.ipynb",
    "rl": "03_rl.ipynb",
    "judge": "04_judge.ipynb",
    "case_studies": "05_case_studies.ipynb",
    "summary": "06_summary.ipynb",
    "synthetic": "07_synthetic.ipynb",
    "seeds": "08_seeds.ipynb",  # reads the stored seeds study (studies/seeds_study.py), beside this build's run
}


class NotebookFailed(RuntimeError):
    pass


def run_notebook(stage: str, profile: str, run_dir: str, overrides: list[str], force: bool,
                 book: Path = BOOK, log_output: bool = False, progress: bool = True) -> Path:
    """Execute one stage's notebook with papermill into ``<book>/generated/``."""
    import papermill as pm

    src = NOTEBOOKS / STAGES[stage]
    out = book / "generated" / STAGES[stage]
    out.parent.mkdir(parents=True, exist_ok=True)
    params = notebook_params(profile, run_dir, overrides, force)
    try:
        pm.execute_notebook(str(src), str(out), parameters=params, kernel_name="python3",
                            cwd=str(ROOT), progress_bar=progress, log_output=log_output)
    except pm.PapermillExecutionError as e:
        raise NotebookFailed(f"stage {stage!r} failed in cell {e.exec_count}: {e.ename}: {e.evalue} "
                             f"(see the executed notebook: {out})") from e
    finally:
        if out.exists():
            settle_streams(out)
    return out


def notebook_params(profile: str, run_dir: str, overrides: list[str], force: bool) -> dict:
    """The papermill parameters of a stage's notebook; ``overrides`` becomes one string that
    ``ctrls.report.provenance.notebook_config`` splits back into the same items (``ctrls.config.overrides.join_overrides``)."""
    from ctrls.config.overrides import join_overrides

    return {"profile": profile, "run_dir": str(Path(run_dir).resolve()), "overrides": join_overrides(overrides),
            "force": force}


# A tqdm line: "desc:  40%|████      | 4/10 [00:04<00:07,  1.23s/cell]", or one without a total.
# a library's FutureWarning/DeprecationWarning as Python prints it: "<file>.py:<line>: FutureWarning: ..."
# and the source line under it (it names this machine's site-packages path)
# (it may start mid-line: a warning raised while a progress bar is drawn follows the bar's text)
DEPRECATION = re.compile(r"[^\s\]]+\.py:\d+: (?:Future|Deprecation)Warning: [^\n]*\n(?:[ \t]+[^\n]*\n?)?")
PROGRESS_LINE = re.compile(r"^.*(?:\d{1,3}%\|.*\||\d+(?:\.\d+)?\s*(?:it|s|cell)/(?:it|s|cell)\]).*$", re.MULTILINE)


def settle_streams(path: Path) -> None:
    """Rewrite an executed notebook's stream outputs as a terminal would show them at the end.

    A kernel records every tqdm refresh as its own ``\\r``-prefixed stream output, so the book
    would print each refresh of a progress bar on a line of its own. Consecutive outputs of one
    stream are joined and each line keeps only the text after its last carriage return: the bar's
    final state, with the rest of the output untouched. A stderr output that holds nothing but
    progress bars is then dropped, and progress-bar lines and libraries' Future/DeprecationWarnings
    are cut from any other stderr output (the book shows results, not progress or library notices), and papermill's
    ``injected-parameters`` cell, which holds this machine's absolute run directory, is tagged
    ``remove-cell``.
    """
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        merged = []
        for o in cell.get("outputs", []):
            if o.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                    and merged[-1].name == o.name:
                merged[-1].text += o.text
            else:
                merged.append(o)
        for o in merged:  # library notices first: one may sit between a bar's refreshes
            if o.output_type == "stream" and o.name == "stderr":
                o.text = DEPRECATION.sub("", o.text)
        for o in merged:
            if o.output_type == "stream" and "\r" in o.text:
                o.text = "\n".join(next((seg for seg in reversed(line.split("\r")) if seg), "")
                                   for line in o.text.split("\n"))
        for o in merged:  # then progress-bar lines go from stderr
            if o.output_type == "stream" and o.name == "stderr":
                if PROGRESS_LINE.search(o.text):
                    o.text = "\n".join(line for line in o.text.split("\n") if not PROGRESS_LINE.search(line))
        merged = [o for o in merged if not (o.output_type == "stream" and o.name == "stderr" and not o.text.strip())]
        if "outputs" in cell:
            cell.outputs = merged
        # papermill's injected parameters hold this machine's absolute run directory: not for the book
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    nbformat.write(nb, str(path))


def build_book(book: Path = BOOK, strict: bool = False) -> Path:
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else (shutil.which("jupyter-book") or "jupyter-book"), "build", str(book)]
    if strict:
        cmd += ["-W", "-n", "--keep-going"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return book / "_build" / "html" / "index.html"


def copy_book(dest: Path) -> Path:
    """A copy of the book's sources (pages, toc, config, MathJax) to build elsewhere."""
    dest = Path(dest).resolve()
    shutil.copytree(BOOK, dest, symlinks=False, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_build", "generated"))
    return dest


class UsageError(Exception):
    """A command-line argument or environment variable that cannot be used: one line, status 2."""


def check_run_dir(run_dir: str) -> Path:
    """``--run-dir``, created if missing; UsageError (one line) when it is not a directory or cannot
    be written, before any stage runs."""
    p = Path(run_dir).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"--run-dir {str(p)!r} is not a directory") from None
    except OSError as e:
        raise UsageError(f"--run-dir {str(p)!r} is not a writable directory ({e.strerror or e})") from None
    return p


def log_level(name: str) -> int:
    """The level ``CTRLS_LOG`` names (DEBUG, INFO, WARNING, ERROR, CRITICAL, any case)."""
    level = logging.getLevelName(name.strip().upper())
    if not isinstance(level, int):
        raise UsageError(f"CTRLS_LOG={name!r} is not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


def cmd_reproduce(args: argparse.Namespace) -> int:
    stages = [s for s in STAGES if (NOTEBOOKS / STAGES[s]).exists()]
    unknown = sorted((set(args.only or []) | set(args.force or [])) - set(STAGES))
    if unknown:
        print(f"unknown stage(s) {unknown}; stages: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    if args.only:
        stages = [s for s in stages if s in args.only]
    from ctrls.config.schema import load_config

    name = load_config(args.profile, args.override).profile  # fail fast on a bad profile or override; a file's stem
    check_run_dir(args.run_dir)
    book = copy_book(Path(args.book_dir)) if args.book_dir else BOOK
    args.gemm_gflops = machine_gemm_gflops()  # this machine's speed, measured before the notebooks load it
    print(f"this machine: {args.gemm_gflops:.0f} GFLOP/s on the 128x576x1536 fp32 product", flush=True)
    t0 = time.time()
    seconds: dict[str, float] = {}
    for i, stage in enumerate(stages, 1):
        print(f"[{i}/{len(stages)}] {stage}: {STAGES[stage]} (profile {args.profile})", flush=True)
        ts = time.time()
        try:
            with relayed(f"[{i}/{len(stages)}] {stage}", args.quiet):  # the stage's own bars, not papermill's cell bar
                run_notebook(stage, args.profile, args.run_dir, args.override, stage in (args.force or []), book,
                             progress=False)
        except NotebookFailed as e:  # one line: the stage, the cell, the error (a table given no samples, ...)
            print(f"ctrls reproduce: {' '.join(str(e).split())}", file=sys.stderr)
            return 1
        seconds[stage] = round(time.time() - ts, 1)
        print(f"[{i}/{len(stages)}] {stage} done in {seconds[stage]:.0f} s", flush=True)
    write_claims_scorecard(args, book)
    write_timings_page(book / "generated" / "timings.md", args, seconds)
    write_rl_profile(book / "generated" / "rl_profile.md", args)
    from ctrls.report.codeindex import write_code_page

    write_code_page(book)  # the method page's index links to it
    if not args.no_book:
        tb = time.time()
        index = build_book(book, strict=args.strict)
        seconds["book build"] = round(time.time() - tb, 1)
        print(f"book: {index}")
    # the peak too: a fresh-clone check deletes the run directory that records it
    print(f"total {time.time() - t0:.0f} s; the largest child process peaked at {peak_kernel_rss_gib():.2f} GiB")
    record_timings(Path(args.run_dir) / name / "reproduce_timings.json", args, seconds, time.time() - t0)
    return 0


def relayed(prefix: str, quiet: bool):
    """The stages' relayed progress (``ctrls.stages.progress.watch``) printed after ``prefix``; nothing when ``quiet``."""
    import contextlib

    if quiet:
        return contextlib.nullcontext()
    from ctrls.stages.progress import watch

    return watch(Path(tempfile.gettempdir()) / f"ctrls-progress-{os.getpid()}.json", prefix)


def write_claims_scorecard(args: argparse.Namespace, book: Path) -> Path:
    """The intro page's findings (``ctrls.report.findings``) and claims scorecard (``ctrls.report.scorecard``),
    from the runs the notebooks made: one computation of the claims for both."""
    from ctrls.report.findings import write_findings
    from ctrls.report.provenance import notebook_config
    from ctrls.report.scorecard import scorecard, write_scorecard

    cfg = notebook_config(args.profile, str(Path(args.run_dir).resolve()), args.override)
    claims = scorecard(cfg)
    path = write_scorecard(cfg, book / "generated" / "scorecard.md", claims)
    print(f"scorecard: {path}", flush=True)
    print(f"findings: {write_findings(cfg, book, claims)}", flush=True)
    return path


def build_facts() -> dict:
    """{commit, cpu, cores} of this build, for the timings page and ``reproduce_timings.json``."""
    from ctrls.report.provenance import cpu_model, git_commit

    return {"commit": git_commit(), "cpu": cpu_model() or platform.processor(), "cores": os.cpu_count()}


def machine_gemm_gflops() -> float:
    """This machine's fp32 GFLOP/s on a decode pass's MLP product (``ctrls.method.backbone.gemm_gflops``), on
    the threads the notebooks' kernels use: a build's seconds times this rate is its work, whatever the machine."""
    from ctrls.method.backbone import gemm_gflops

    return round(gemm_gflops(), 1)


def peak_kernel_rss_gib() -> float:
    """The peak resident memory of the largest finished child process (each notebook's kernel), GiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # kB on Linux


def write_timings_page(path: Path, args: argparse.Namespace, seconds: dict[str, float]) -> Path:
    """The intro page's "Time and memory" table: this build's seconds per notebook, measured by this
    ``ctrls reproduce`` run (the book build itself is timed after the page is written: it is in
    ``runs/<profile>/reproduce_timings.json``)."""
    build = build_facts()
    rows = "\n".join(f"| {STAGES[k]} | {v:.0f} |" for k, v in seconds.items())
    total, rate = sum(seconds.values()), getattr(args, "gemm_gflops", float("nan"))
    over = f" with overrides {', '.join(f'`{o}`' for o in args.override)}" if args.override else ""
    machine = ", ".join(x for x in (f"commit `{build['commit']}`" if build["commit"] not in ("", "unknown") else "",
                                    build["cpu"] or "", f"{build['cores']} cores") if x)
    work = (f" That machine does {rate:.0f} GFLOP/s on the 128×576×1536 fp32 product, so the notebooks were about "
            f"{total * rate / 1000:,.0f} TFLOP·s of its work." if rate == rate else "")
    text = (f"This book's notebooks ran in **{total / 60:.1f} minutes** on profile `{args.profile}`{over} ({machine})."
            f"{work} The largest notebook kernel peaked at {peak_kernel_rss_gib():.1f} GiB of resident memory. "
            "A stage whose runs were already in the run directory was reused: its time is only what this build ran."
            "\n\n| notebook | seconds |\n|---|---:|\n" + rows + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_rl_profile(path: Path, args: argparse.Namespace) -> Path:
    """The reproduce page's table of where the RL stage's time went (``ctrls.stages.rl.profile_markdown``)."""
    from ctrls.report.provenance import notebook_config
    from ctrls.stages.rl import profile_markdown

    cfg = notebook_config(args.profile, str(Path(args.run_dir).resolve()), args.override)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_markdown(cfg))
    return path


def record_timings(path: Path, args: argparse.Namespace, seconds: dict[str, float], total: float) -> None:
    """Write the wall time of each notebook and of the book build of this ``ctrls reproduce`` run,
    with the commit and the machine, to ``runs/<profile>/reproduce_timings.json`` (the intro page's
    timings come from such a file)."""
    from ctrls.stages.common import save_json

    path.parent.mkdir(parents=True, exist_ok=True)
    save_json({"profile": args.profile, "overrides": list(args.override or []), **build_facts(),  # atomically
               "seconds": seconds, "total_s": round(total, 1),
               "gemm_gflops": getattr(args, "gemm_gflops", None),  # total_s x gemm_gflops: the build's work
               "peak_kernel_rss_gib": round(peak_kernel_rss_gib(), 2),
               "stages_reused": "runs already present are reused; rerun on an empty run_dir to time every stage"},
              path, indent=1)


def cmd_stage(args: argparse.Namespace) -> int:
    """Run library stages without notebooks, in one process (data-parallel under ``accelerate launch``)."""
    from ctrls.config.overrides import parse_overrides
    from ctrls.config.schema import load_config
    from ctrls.stages.distributed import shutdown, world

    cfg = load_config(args.profile, {**parse_overrides(args.override), "run_dir": str(Path(args.run_dir).resolve())})
    check_run_dir(args.run_dir)
    w = world()
    for name in args.names:
        t0 = time.time()
        if name == "pretrain":
            from ctrls.stages.pretrain import pretrain

            for b, d in cfg.pairs():
                pretrain(cfg.for_pair(b, d), force=args.force, progress=not args.quiet)
            out = cfg.stage_dir("pretrain")
        elif name == "exploration":
            from ctrls.stages.exploration import explore

            out = explore(cfg, force=args.force, progress=not args.quiet)
        else:
            from ctrls.stages.rl import run_rl

            out = run_rl(cfg, force=args.force, progress=not args.quiet)
        if w.is_main:
            print(f"{name}: {out} ({w.size} process{'es' if w.size > 1 else ''}, {time.time() - t0:.0f} s)", flush=True)
    shutdown()
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    """``ctrls runs``: every stage run stored under ``--run-dir``, with its overrides, commit and time;
    ``ctrls runs rm NAME``: remove one (its directory and the outputs it wrote beside it)."""
    from ctrls.stages.listing import listing, remove_run

    if args.runs_cmd == "rm":
        for p in remove_run(args.run_dir, args.name):
            print(f"removed {p}")
        return 0
    print(listing(args.run_dir, args.profile))
    return 0


def cmd_verify_references(args: argparse.Namespace) -> int:
    from ctrls.data.problems import reference_verify_report

    rep = reference_verify_report(args.dataset, args.split, data_dir=args.data_dir, cross_check=args.math_verify)
    for f in rep["failures"]:
        print(f"FAIL {f}")
    print(f"{args.dataset}/{args.split}: {rep['n'] - len(rep['failures'])}/{rep['n']} reference solutions "
          f"verify against their gold answer ({100 * rep['rate']:.2f}%)")
    if args.math_verify:  # the cross-check: math-verify's own extraction and comparison
        for f in rep["only_math_verify"]:
            print(f"ONLY MATH-VERIFY {f}")
        print(f"math-verify alone: {rep['math_verify']}/{rep['n']} verify; {len(rep['only_math_verify'])} of them "
              "not by this checker")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from ctrls.config.schema import available_profiles

    print("\n".join(available_profiles()))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """``--explain KEY``: the key's docstring, type, default and allowed values (a section: its keys too);
    ``--explain`` alone: every key with its default and its docstring's first line. An unknown key is a
    ConfigError naming the closest known keys (status 2)."""
    from ctrls.config.explain import explain, listing

    print(explain(args.explain) if args.explain else listing())
    return 0


RUN_DIR_HELP = ("where the stages write and read their runs (default: runs/ in the repository); a run of another config "
                "is stored beside the profile's own, in <stage>@<key>")
PROFILE_HELP = "the named profile (ctrls profiles lists them) or a YAML file; default demo"
LOG_LEVEL_HELP = "DEBUG, INFO (default), WARNING, ERROR or CRITICAL (else $CTRLS_LOG)"
OVERRIDE_HELP = "config overrides, e.g. rl.steps=3 \"grid.epsilons=[0.1, 0.3]\" (ctrls config --explain KEY: what a key means)"


def main(argv: list[str] | None = None) -> None:
    try:
        level = log_level(os.environ.get("CTRLS_LOG", "INFO"))
    except UsageError as e:
        print(f"ctrls: {e}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="ctrls", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version_line(), help="print the version and commit, and exit")
    p.add_argument("--log-level", default=None, metavar="LEVEL", help=LOG_LEVEL_HELP)
    sub = p.add_subparsers(dest="cmd", required=True)
    # --log-level and --quiet after any command too (ctrls stage rl --log-level DEBUG): SUPPRESS keeps one given
    # before the command when none is given after it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, metavar="LEVEL", help=LOG_LEVEL_HELP)
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help="warnings and errors only")

    r = sub.add_parser("reproduce", help="run the notebooks through papermill, then build the book",
                       parents=[common])
    r.add_argument("--profile", default="demo", help=PROFILE_HELP)
    r.add_argument("--run-dir", default=str(ROOT / "runs"), help=RUN_DIR_HELP)
    r.add_argument("--quiet", action="store_true", help="only the stage lines and errors: no progress, warnings only in the log")
    r.add_argument("--only", nargs="+", metavar="STAGE", help=f"run only these stages ({', '.join(STAGES)})")
    r.add_argument("--force", nargs="+", metavar="STAGE", help="recompute these stages even if cached")
    r.add_argument("-o", "--override", nargs="*", action="extend", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP)
    r.add_argument("--no-book", action="store_true", help="run the notebooks only")
    r.add_argument("--strict", action="store_true", help="build the book with -W (warnings are errors)")
    r.add_argument("--book-dir", default=None, help="build a copy of the book there instead of in book/")
    r.set_defaults(fn=cmd_reproduce)

    st = sub.add_parser("stage", help="run library stages without notebooks (data-parallel under accelerate launch)",
                        parents=[common])
    st.add_argument("names", nargs="*", metavar="STAGE", help="pretrain, exploration and/or rl, run in the order given")
    st.add_argument("--profile", default="demo", help=PROFILE_HELP)
    st.add_argument("--run-dir", default=str(ROOT / "runs"), help=RUN_DIR_HELP)
    st.add_argument("--force", action="store_true", help="recompute even if cached")
    st.add_argument("--quiet", action="store_true", help="no progress bars")
    st.add_argument("-o", "--override", nargs="*", action="extend", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP)
    st.set_defaults(fn=cmd_stage)

    ru = sub.add_parser("runs", help="list the stage runs stored under the run directory (ctrls runs rm NAME: remove one)",
                        parents=[common, quiet])
    ru.add_argument("--run-dir", default=str(ROOT / "runs"), help=RUN_DIR_HELP)
    ru.add_argument("--profile", default=None, help="list this profile's runs only (default: every profile's)")
    rsub = ru.add_subparsers(dest="runs_cmd")
    rm = rsub.add_parser("rm", help="remove one stored run: its directory and the outputs it wrote beside it",
                          parents=[common, quiet])
    rm.add_argument("name", metavar="NAME", help="the run as ctrls runs names it, e.g. demo/exploration@3f9c0a1b2d4e5f60")
    rm.add_argument("--run-dir", default=argparse.SUPPRESS, help=RUN_DIR_HELP)
    ru.set_defaults(fn=cmd_runs)

    v = sub.add_parser("verify-references", help="rate at which reference solutions verify against gold",
                       parents=[common, quiet])
    v.add_argument("--dataset", default="gsm8k", help="gsm8k, math, gsm_symbolic, word_problems or a JSONL folder")
    v.add_argument("--split", default="test", help="train or test")
    v.add_argument("--data-dir", default=None, help="where the datasets' files are read from (default as data.data_dir)")
    v.add_argument("--math-verify", action="store_true",
                   help="cross-check: grade each solution with math-verify alone too, and list those only it verifies")
    v.set_defaults(fn=cmd_verify_references)

    pr = sub.add_parser("profiles", help="list the named profiles", parents=[common, quiet])
    pr.set_defaults(fn=cmd_profiles)

    c = sub.add_parser("config", help="explain the config keys: what each means, its default and allowed values",
                       parents=[common, quiet])
    c.add_argument("--explain", nargs="?", const="", required=True, metavar="KEY",
                   help="a dotted key (rl.lr) or a section (rl); without KEY, every key")
    c.set_defaults(fn=cmd_config)

    args = p.parse_args(argv)
    if args.log_level is not None:
        try:
            logging.getLogger().setLevel(log_level(args.log_level))
        except UsageError as e:
            p.error(str(e).replace("CTRLS_LOG=", "--log-level "))
    if getattr(args, "quiet", False) and args.log_level is None:
        logging.getLogger().setLevel(logging.WARNING)
    if args.cmd == "stage":  # a stage named after -o KEY=VALUE items is taken by -o's list: it is a stage, not a key
        args.names += [o for o in args.override if o in STAGE_NAMES]
        args.override = [o for o in args.override if o not in STAGE_NAMES]
        bad = [n for n in args.names if n not in STAGE_NAMES]
        if not args.names or bad:
            st.error(f"STAGE must be one or more of {', '.join(STAGE_NAMES)}; got {', '.join(bad) or 'none'}")
    from ctrls.config.schema import ConfigError
    from ctrls.data.problems import DataError
    from ctrls.method.backbone import BackboneError
    from ctrls.stages.collect import PretrainError
    from ctrls.stages.listing import RunNotFoundError
    from ctrls.stages.runs import ArtifactError, RunDirError, StageBusyError

    try:
        rc = args.fn(args)
    except ConfigError as e:  # a bad profile or override: one line, no traceback, argparse's status
        print(f"ctrls {args.cmd}: config error: {' '.join(str(e).split())}", file=sys.stderr)
        rc = 2
    except UsageError as e:  # an unusable --run-dir: one line, argparse's status
        print(f"ctrls {args.cmd}: {e}", file=sys.stderr)
        rc = 2
    except DataError as e:  # an unknown dataset or split, missing or malformed data: one line
        print(f"ctrls {args.cmd}: data error: {' '.join(str(e).split())}", file=sys.stderr)
        rc = 1
    except RunNotFoundError as e:  # ctrls runs rm of a name that is no stored run
        print(f"ctrls {args.cmd}: {e}", file=sys.stderr)
        rc = 2
    except StageBusyError as e:  # another process holds the stage's lock: one line naming it
        print(f"ctrls {args.cmd}: {' '.join(str(e).split())}", file=sys.stderr)
        rc = 1
    except RunDirError as e:  # a directory under --run-dir that cannot be written, a lock that is a link
        print(f"ctrls {args.cmd}: {' '.join(str(e).split())}", file=sys.stderr)
        rc = 2
    except (PretrainError, ArtifactError, BackboneError) as e:  # a missing earlier stage, a damaged file, a bad model path
        print(f"ctrls {args.cmd}: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        rc = 1
    except Exception as e:  # a full disk wherever a stage writes (an OSError, or a library's own error for OS error 28)
        where = full_disk(e)
        if where is None:
            raise
        print(f"ctrls {args.cmd}: cannot write {where or getattr(args, 'run_dir', 'the run directory')}: no space left on "
              "the device that holds it; free some space or use a run_dir on another disk (finished stages are kept)",
              file=sys.stderr)
        rc = 2
    sys.exit(rc)


def full_disk(e: BaseException) -> str | None:
    """The file a full disk (ENOSPC, EDQUOT) failed to write in ``e`` or the errors it was raised from ("" when
    none is named), or None when ``e`` is no full disk."""
    from ctrls.errors import says_full_disk

    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return str(e.filename or "")
        if says_full_disk(e):
            return ""
        e = e.__cause__ or e.__context__
    return None


STAGE_NAMES = ("pretrain", "exploration", "rl")


def version_line() -> str:
    """"ctrls 0.1.0 (commit abc1234)": the installed version and the checkout's commit."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("ctrls")
    except PackageNotFoundError:
        v = "unknown"
    from ctrls.report.provenance import git_commit

    return f"ctrls {v} (commit {git_commit()})"


if __name__ == "__main__":
    main()
