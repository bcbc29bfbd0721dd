"""Shared fixtures: the embedded SmolLM2 backbone (integration) and tiny random-weight models (unit)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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


SMOKE_OVERRIDES = ["sampling.batch_size=2"]  # one question per sampling chunk: a kill can land between chunks


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """A run directory where the smoke profile's pretraining and exploration stages have run once."""
    from ctrls.config import load_config
    from ctrls.stages.exploration import explore
    from ctrls.stages.pretrain import pretrain

    d = tmp_path_factory.mktemp("smoke_runs")
    cfg = load_config("smoke", [*SMOKE_OVERRIDES, f"run_dir={d}"])
    run = pretrain(cfg.for_pair(*cfg.pairs()[0]), progress=False)
    explore(cfg, progress=False)
    return d, cfg, run


@pytest.fixture(scope="session")
def smoke_book(smoke_runs, tmp_path_factory):
    """The whole smoke book, built once: every notebook through papermill, then `jupyter-book build -W`.

    Returns the built site's directory (`<book>/_build/html`).
    """
    import subprocess
    import sys

    run_dir, _, _ = smoke_runs
    book = tmp_path_factory.mktemp("smoke_book") / "book"
    r = subprocess.run([sys.executable, "-m", "ctrls", "reproduce", "--profile", "smoke", "--run-dir", str(run_dir),
                        "--book-dir", str(book), "--strict", "-o", *SMOKE_OVERRIDES],
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
