"""Shared fixtures: the embedded SmolLM2 backbone (integration) and tiny random-weight models (unit)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (`make test`: `-n 2 --dist loadfile`) each worker has one core: one torch thread
# per worker, and for the processes the tests start (the smoke book's notebook kernels, the CLI runs),
# so that two workers' intra-op threads do not fight over the cores. Set before torch is imported.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def pytest_configure(config):
    if XDIST_WORKER:
        import torch

        torch.set_num_threads(1)


# The slowest modules first, the smoke book's at the head: under `-n 2 --dist loadfile
# --no-loadscope-reorder` (`make test`) one worker builds the book while the other starts on the next
# ones, and the many quick modules fill in at the end (longest first). Only the order changes.
SLOW_FIRST = ("test_book.py", "test_resume.py", "test_distributed.py", "test_readback.py", "test_exploration.py",
              "test_static_decode.py", "test_pretrain.py", "test_controls.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module's own order stays

requires_data = pytest.mark.skipif(not SHARED_DATA.exists(), reason=f"benchmark data not found at {SHARED_DATA}")


@pytest.fixture(scope="session")
def smollm():
    """The real embedded backbone (converted once to a safetensors cache)."""
    from ctrls.backbone import load_backbone

    return load_backbone("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(smollm):
    return smollm.tokenizer


@pytest.fixture(scope="session")
def tiny_llama(tokenizer):
    from ctrls.backbone import tiny_backbone

    return tiny_backbone("llama", tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2(tokenizer):
    from ctrls.backbone import tiny_backbone

    return tiny_backbone("qwen2", tokenizer, seed=1)


SMOKE_OVERRIDES = ["sampling.batch_size=4"]  # two questions per sampling chunk (of 3): a kill can land between chunks


def _session_dir(tmp_path_factory) -> Path:
    """A directory that every xdist worker of this session shares (the base temp dir without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER else base


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """A run directory where the smoke profile's pretraining and exploration stages have run once.

    Built once per test session: the first xdist worker that needs it runs the stages under a file
    lock; any other finds them finished and reuses them (a finished stage is read without its lock).
    Tests read it, or copy stages out of it; none writes into it."""
    from filelock import FileLock

    from ctrls.config import load_config
    from ctrls.stages.exploration import explore
    from ctrls.stages.pretrain import pretrain

    root = _session_dir(tmp_path_factory)
    d = root / "smoke_runs"
    cfg = load_config("smoke", [*SMOKE_OVERRIDES, f"run_dir={d}"])
    with FileLock(str(root / "smoke_runs.lock")):
        run = pretrain(cfg.for_pair(*cfg.pairs()[0]), progress=False)
        explore(cfg, progress=False)
    return d, cfg, run


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """The whole smoke book, built once: every notebook through papermill, then `jupyter-book build -W`.

    Its own run directory, from scratch, on the smoke profile as it is (16 sequences per sampling
    chunk: no SMOKE_OVERRIDES, which only the kill-and-resume tests need), so that it does not wait
    for `smoke_runs`. Its users are all in test_book.py: under `--dist loadfile` one worker builds it.
    Returns the built site's directory (`<book>/_build/html`).
    """
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("smoke_book")
    book = d / "book"
    r = subprocess.run([sys.executable, "-m", "ctrls", "reproduce", "--profile", "smoke", "--run-dir", str(d / "runs"),
                        "--book-dir", str(book), "--strict"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return book / "_build" / "html"


@pytest.fixture
def one_thread():
    """Many tiny ops: on a busy 2-core machine, intra-op threading makes each one ~20x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
