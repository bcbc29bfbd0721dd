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
# --no-loadscope-reorder` (`make test`) one worker builds the book while the other takes the next
# ones, which do not need it; the modules that read the book's run directory (`smoke_runs`:
# exploration, pretraining, controls) come after enough others that the book is built when they
# start, and the many quick modules fill in at the end. Only the order changes.
SLOW_FIRST = ("test_book.py", "test_runs_resume.py", "test_distributed.py", "test_decoding_readback.py", "test_static_decode.py",
              "test_reinforce.py", "test_sitecheck.py", "test_sitecheck_page.py", "test_sampling.py", "test_exploration.py",
              "test_pretrain.py", "test_controls.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module's own order stays

requires_data = pytest.mark.skipif(not SHARED_DATA.exists(), reason=f"benchmark data not found at {SHARED_DATA}")


@pytest.fixture(scope="session")
def smollm():
    """The real embedded backbone (converted once to a safetensors cache)."""
    from ctrls.method.backbone import load_backbone

    return load_backbone("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(smollm):
    return smollm.tokenizer


@pytest.fixture(scope="session")
def tiny_llama(tokenizer):
    from ctrls.method.backbone import tiny_backbone

    return tiny_backbone("llama", tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2(tokenizer):
    from ctrls.method.backbone import tiny_backbone

    return tiny_backbone("qwen2", tokenizer, seed=1)


SMOKE_OVERRIDES = ["sampling.batch_size=4"]  # two questions per sampling chunk (of 3): a kill can land between chunks


def _session_dir(tmp_path_factory) -> Path:
    """A directory that every xdist worker of this session shares (the base temp dir without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER else base


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """The smoke book's run directory (``smoke_book_dir``): every stage of the smoke profile on the real
    backbone, run once per session. Returns the directory, the config and pretraining's run (its
    finished stages read back, nothing recomputed). Tests read it, or copy stages out of it; none
    writes into it."""
    from ctrls.config.schema import load_config
    from ctrls.stages.pretrain import pretrain

    d = smoke_book_dir(tmp_path_factory) / "runs"
    cfg = load_config("smoke", [f"run_dir={d}"])
    run = pretrain(cfg.for_pair(*cfg.pairs()[0]), progress=False)
    return d, cfg, run


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A random-weight Llama (``tiny_backbone``: 2 layers, width 64) with SmolLM2's tokenizer and chat
    template, saved once per session as a local model directory that ``backbone.name`` can name.

    For the tests of the stages' mechanics (kill and resume, one process against two), which compare a
    run with another run of the same code and need no sensible text: a decode step costs ~1 ms, not
    SmolLM2's ~150 ms on one core. What needs the real model (the smoke book, the read-back on the real
    backbone, the controls) keeps ``smoke_runs``."""
    from filelock import FileLock

    from ctrls.method.backbone import tiny_backbone

    root = _session_dir(tmp_path_factory)
    d = root / "tiny_llama_model"
    with FileLock(str(root / "tiny_llama_model.lock")):
        if not (d / "config.json").exists():
            bb = tiny_backbone("llama", tokenizer, seed=0)
            tmp = root / "tiny_llama_model.tmp"
            bb.model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.rename(d)
    return d


def tiny_overrides(model_dir: Path) -> list[str]:
    """Config overrides that run the smoke profile on the model saved by ``tiny_model_dir``."""
    return [f"backbone.name={model_dir}", f"grid.backbones=[{model_dir}]"]


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, tiny_model_dir):
    """``smoke_runs`` on the tiny model (``tiny_model_dir``): pretraining and exploration of the smoke
    profile run once per session, under a file lock, for the tests of the stages' mechanics."""
    from filelock import FileLock

    from ctrls.config.schema import load_config
    from ctrls.stages.exploration import explore
    from ctrls.stages.pretrain import pretrain

    root = _session_dir(tmp_path_factory)
    d = root / "tiny_runs"
    cfg = load_config("smoke", [*SMOKE_OVERRIDES, *tiny_overrides(tiny_model_dir), f"run_dir={d}"])
    with FileLock(str(root / "tiny_runs.lock")):
        run = pretrain(cfg.for_pair(*cfg.pairs()[0]), progress=False)
        explore(cfg, progress=False)
    return d, cfg, run


def smoke_book_dir(tmp_path_factory) -> Path:
    """The whole smoke book, built once per session: ``ctrls reproduce --profile smoke --strict`` (every
    notebook through papermill, then ``jupyter-book build -W``) into ``<session>/smoke_book`` (``runs``,
    ``book``), on the smoke profile as it is.

    The first xdist worker that needs it builds it under a file lock; any other waits for it and reuses
    it. A failed build is recorded (``failed``, with the command's output) and fails every later user
    at once with that output, rather than building again."""
    import subprocess
    import sys

    from filelock import FileLock

    root = _session_dir(tmp_path_factory)
    d = root / "smoke_book"
    with FileLock(str(root / "smoke_book.lock")):
        if (d / "failed").exists():
            pytest.fail("the smoke book failed to build earlier in this session:\n" + (d / "failed").read_text())
        if not (d / "built").exists():
            d.mkdir(exist_ok=True)
            r = subprocess.run([sys.executable, "-m", "ctrls", "reproduce", "--profile", "smoke", "--run-dir",
                                str(d / "runs"), "--book-dir", str(d / "book"), "--strict"],
                               cwd=ROOT, capture_output=True, text=True)
            if r.returncode != 0:
                (d / "failed").write_text((r.stdout + r.stderr)[-4000:])
                pytest.fail("`ctrls reproduce --profile smoke --strict` failed:\n" + (r.stdout + r.stderr)[-4000:])
            (d / "built").write_text("")
    return d


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """The built smoke book's site directory (``<book>/_build/html``; ``smoke_book_dir``)."""
    return smoke_book_dir(tmp_path_factory) / "book" / "_build" / "html"


@pytest.fixture
def one_thread():
    """Many tiny ops: on a busy 2-core machine, intra-op threading makes each one ~20x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def scripted(monkeypatch):
    """Scripted decoding, the engine's token draw (and the state prompt's static path's) replaced by each row's script:
    ``run(bb, prompts, scripts, params, **sample_kw) -> (generations, logp)``, one sample of each prompt whose
    j-th drawn token is ``scripts[i][j]``; ``logp[i][j]`` the decode's log P of that token (EOS included)."""
    import torch

    import ctrls.generate.sampling as sampling
    import ctrls.generate.static_decode as static_decode
    from ctrls.method.streams import stream_key

    def run(bb, prompts, scripts, params, **kw):
        seeds = list(range(100, 100 + len(prompts)))
        row_of = {stream_key(s, 0): i for i, s in enumerate(seeds)}
        logp = [[] for _ in prompts]

        def pick(logits, temperature, top_k, keys, counters):
            lp = torch.log_softmax(logits.float(), -1)
            out = []
            for b, (k, c) in enumerate(zip(keys.tolist(), counters.tolist())):
                i = row_of[k]
                logp[i].append(float(lp[b, scripts[i][c]]))
                out.append(scripts[i][c])
            return torch.tensor(out)

        monkeypatch.setattr(sampling, "_pick", pick)
        monkeypatch.setattr(static_decode, "_pick", pick)  # the state prompt's static path draws through it too
        return sampling.sample(bb, prompts, 1, params, seeds=seeds, **kw), logp

    return run
