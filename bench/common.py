"""What the benchmarks share: the questions, a random-weight CTRLS model, the forced-length sampling
parameters, and the aten-op counters.

Imported by ``bench/sampling.py``, ``bench/rl.py``, ``bench/prefill.py``, ``bench/prefix_attention.py``,
``bench/state_prompt_decode.py``, ``bench/state_prompt_fit.py`` and ``bench/gpu/gpuest`` (each run as a script from the
repository root, so ``bench/`` is on ``sys.path``). Running this file does nothing.
"""
from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ctrls.generate.sampling import SampleParams
from ctrls.method.model import CTRLSModel
from ctrls.report.provenance import cpu_model

# short GSM8K-like questions (not from the data set); bench/sampling.py and bench/rl.py use the first 4
QUESTIONS = [
    "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have?",
    "A book costs $12 and a pen costs $3. How much do 4 books and 5 pens cost?",
    "Sam reads 25 pages a day. How many days does he need for a 300-page book?",
    "A tank holds 120 liters and leaks 4 liters an hour. How much is left after 9 hours?",
    "Lena has 48 stickers and gives a quarter of them to her brother. How many does she keep?",
    "A bus carries 42 people. 15 get off and 9 get on. How many people are on the bus now?",
    "A shirt costs $25 and is on sale for 20% off. What is the sale price?",
    "Tom runs 3 km every weekday and 5 km each weekend day. How far does he run in a week?",
]


def machine() -> dict:
    """The machine a benchmark ran on: CPU model, torch threads, torch version, load average."""
    return {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "load_average": list(os.getloadavg())}


def demo_decode() -> tuple:
    """(backbone, prompts, params) of the demo's own decode: SmolLM2-135M-Instruct in fp32, 32 word-problem
    test questions (x 4 samples: 128 rows, the demo's ``sampling.batch_size``) with its 1-shot chat
    prompt, eta = 0.7, its top-k, token limit and step limit."""
    from ctrls.config.schema import load_config
    from ctrls.data.problems import load_problems
    from ctrls.data.prompts import prompt_ids
    from ctrls.method.backbone import load_backbone

    bb = load_backbone("smollm2-135m-instruct", device="cpu", dtype="float32")
    cfg = load_config("demo")
    probs = load_problems("word_problems", "test", 32, seed=0, difficulty=cfg.data.word_problems.difficulty())
    prompts = [prompt_ids(bb.tokenizer, q.question, True, cfg.prompt.few_shot) for q in probs]
    params = SampleParams(temperature=0.7, top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens,
                          max_steps=cfg.prompt.max_steps, batch_size=cfg.sampling.batch_size)
    return bb, prompts, params


def timed_decode(bb, prompts, params, variant) -> tuple[float, list]:
    """(seconds, tokens) of one decode of ``prompts``, 4 samples each, seeded by their index, inside the
    context manager ``variant`` (the setting a benchmark compares)."""
    from ctrls.generate.sampling import sample

    with variant:
        t = time.perf_counter()
        gens = sample(bb, prompts, 4, params, seeds=list(range(len(prompts))))
        return time.perf_counter() - t, [g.token_ids for gs in gens for g in gs]


def write_result(res: dict, out: str | None) -> None:
    """Write a benchmark's JSON result to ``out`` (when given, :func:`write_json`), and print it as the last line."""
    if out:
        write_json(out, res)
    else:
        refuse_non_finite(res, out)
    print(json.dumps(res, allow_nan=False))


def write_json(out: str | os.PathLike, data, *, default=None) -> None:
    """Write ``data`` as JSON to ``out`` (creating its folder): refused naming its field when it holds a non-finite
    number (no reader takes a bare NaN), serialised before the file is touched, then :func:`replace_file`: a
    failure midway leaves the old file whole. ``default`` is json's (``str`` for a measurement's odd values)."""
    refuse_non_finite(data, out)
    replace_file(out, json.dumps(data, indent=1, allow_nan=False, default=default))


def refuse_non_finite(data, out=None) -> None:
    """A ValueError naming the file and the field of the first NaN or infinity in ``data``."""
    bad = non_finite(data)
    if bad is not None:
        raise ValueError(f"{out or 'the result'}: {bad[0] or '(the result)'} is {bad[1]}, not a finite number; nothing written")


def replace_file(out: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``out`` (creating its folder) through a temporary file in the same folder, fsynced and
    renamed: a reader, or a kill midway, sees the old file or the new one, never half of one."""
    out = os.fspath(out)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = os.path.join(os.path.dirname(out) or ".", f".{os.path.basename(out)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def non_finite(value, at: str = "") -> tuple[str, float] | None:
    """(field, value) of the first NaN or infinity in a result (``a.b[2]``), or None."""
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):  # np.float32 is no float
        return at, float(value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for k, v in items:
        hit = non_finite(v, f"{at}[{k}]" if isinstance(k, int) else f"{at}.{k}" if at else str(k))
        if hit is not None:
            return hit
    return None


def gemm_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 3) -> float:
    """The GFLOP/s of an n x n matrix product in ``dtype`` on this machine (after one warm-up)."""
    a = torch.randn(n, n, dtype=dtype)
    a @ a
    t = time.perf_counter()
    for _ in range(reps):
        a @ a
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def random_ctrls(bb, K: int = 16, k: int = 4, rank: int = 64) -> CTRLSModel:
    """``CTRLSModel.random`` for the backbone ``bb`` (seed 0), on its device: ``K`` states, spectral ``k``,
    adapter ``rank``, a small random adapter output (std 0.01)."""
    return CTRLSModel.random(bb.hidden_size, K, k, rank).to(bb.device)


def forced_params(rows: int, new: int, epsilon: float = 0.1) -> SampleParams:
    """Sampling parameters that make every one of ``rows`` rows decode exactly ``new`` tokens (EOS and
    answers ignored, no step limit): temperature 0.7, top-k 50, one batch."""
    return SampleParams(temperature=0.7, top_k=50, max_new_tokens=new, max_steps=10**6, stop_at_answer=False,
                        ignore_eos=True, batch_size=rows, epsilon=epsilon)


NO_KERNEL = {"aten::lift_fresh", "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided",
             "aten::new_empty", "aten::new_empty_strided"}


def op_kind(func) -> str:
    """'sync' (a tensor read by the host: a device-to-host copy and a synchronisation on CUDA), 'view'
    (metadata only: views, allocations; no kernel on CUDA) or 'kernel' (launches a kernel on CUDA)."""
    name = func._schema.name
    if name == "aten::_local_scalar_dense":
        return "sync"
    if getattr(func, "is_view", False) or name in NO_KERNEL:
        return "view"
    return "kernel"


class DispatchCounter(TorchDispatchMode):
    """Counts aten ops by kind (``op_kind``): 'sync' (``_local_scalar_dense``: the host reads a tensor),
    'view' (views and allocations, no kernel on a GPU), 'kernel' (the rest: a kernel launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.counts = {"kernel": 0, "view": 0, "sync": 0, "cpu_copy": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[op_kind(func)] += 1
        return func(*args, **(kwargs or {}))


class CpuCopyCounter(TorchFunctionMode):
    """Counts ``Tensor.cpu()`` calls (no aten op on a CPU tensor; a device-to-host copy and sync on a GPU)."""

    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "cpu":
            self.counts["cpu_copy"] += 1
        return func(*args, **(kwargs or {}))
