"""Compile, once, the byte-code of the modules that every test worker and notebook kernel imports.

`make` runs its commands with a byte-code cache inside the venv (PYTHONPYCACHEPREFIX; see the
Makefile): a module is compiled when a process first imports it. Without this warm-up the first
processes of a run (two test workers and the smoke book's first kernel start together) would each
compile the same torch, transformers and ctrls modules at once. `make` runs the two groups below side
by side, after installing. Only a warm-up: a module that fails to import is skipped (the process
that needs it will say why), and the exit status is always 0.

Usage: python tools/warm_bytecode.py {models,book}
"""
from __future__ import annotations

import importlib
import sys
import time

GROUPS = {
    # the library and what it imports: torch, transformers (the two model families ctrls builds)
    "models": ["torch", "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
               "ctrls.cli", "ctrls.stages.pretrain", "ctrls.stages.exploration", "ctrls.stages.rl",
               "ctrls.stages.judge", "ctrls.report.scorecard", "ctrls.stages.synthetic", "ctrls.report.tables",
               "ctrls.report.beside_paper", "ctrls.report.cases", "ctrls.report.findings", "ctrls.report.plots",
               "ctrls.report.studies", "ctrls.report.setup_check", "ctrls.report.verdicts", "ctrls.stages.distributed",
               "accelerate"],
    # first what the library also imports but not through torch (so that the other group finds it
    # compiled), then the notebooks' machinery, the book's build, the browser check and the test runner
    "book": ["pandas", "pyarrow.parquet", "scipy.stats", "scipy.optimize", "sklearn.cluster", "seaborn",
             "papermill", "nbclient", "nbformat", "ipykernel.kernelapp", "ipykernel.ipkernel", "jupyter_client",
             "jupyter_book.cli.main", "sphinx.application", "sphinx.builders.html", "myst_nb", "myst_parser",
             "sphinx_book_theme", "pydata_sphinx_theme", "sphinx_design", "sphinx_togglebutton", "sphinx_copybutton",
             "sphinx_external_toc", "sphinx_thebe", "sphinx_comments", "sphinx_multitoc_numbering",
             "sphinxcontrib.bibtex", "matplotlib.pyplot", "playwright.sync_api", "pytest", "xdist", "openai"],
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in GROUPS:
        print(f"usage: python tools/warm_bytecode.py {{{','.join(GROUPS)}}}", file=sys.stderr)
        return 0
    t, before, skipped = time.perf_counter(), len(sys.modules), []
    for name in GROUPS[argv[0]]:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a warm-up only: the process that needs it reports it
            skipped.append(f"{name} ({type(e).__name__})")
    print(f"byte-code warm-up ({argv[0]}): {len(sys.modules) - before} modules in {time.perf_counter() - t:.0f} s"
          + (f"; skipped {', '.join(skipped)}" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
