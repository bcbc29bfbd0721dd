"""The two backbones of the paper as random-weight models of their shapes (no weights downloaded), the
tokenizer they share, the LM-head bias that makes them draw newlines, and their parameter and byte counts."""
from __future__ import annotations

from pathlib import Path

import torch

SHAPES = {
    "Qwen/Qwen2.5-3B-Instruct": dict(arch="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                      num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                      rope_theta=1e6, max_position_embeddings=32768),
    "meta-llama/Llama-3.2-3B-Instruct": dict(arch="llama", hidden_size=3072, intermediate_size=8192,
                                             num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                                             vocab_size=128256, rope_theta=5e5, max_position_embeddings=131072),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

BF16 = 2  # bytes per weight, KV entry and logit


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path and Path(path).exists():
        tok = AutoTokenizer.from_pretrained(path)
    else:
        from ctrls.method.backbone import load_backbone

        tok = load_backbone("smollm2-135m-instruct", device="cpu").tokenizer
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def backbone_config(name: str, tok=None, tiny: bool = False, **changes):
    """The transformers config of the backbone's shape (``SHAPES``); ``tiny``: small layers and the
    tokenizer's vocabulary (a check of the script); ``changes`` override entries (e.g. the depth)."""
    from transformers import LlamaConfig, Qwen2Config

    shape = dict(SHAPES[name])
    arch = shape.pop("arch")
    if tiny:
        shape.update(TINY, vocab_size=len(tok))
    shape.update(changes)
    ids = {} if tok is None else dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                      pad_token_id=tok.pad_token_id)
    return {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch](**shape, tie_word_embeddings=True, **ids)


def build_backbone(name: str, tok, dev: torch.device, dtype: torch.dtype, tiny: bool, **changes):
    """A random-weight model of the backbone's shape, frozen, with a (zero) bias on the LM head."""
    from transformers import AutoModelForCausalLM

    from ctrls.method.backbone import freeze

    cfg = backbone_config(name, tok, tiny, **changes)
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, device=dev, dtype=dtype)
    head.weight = old.weight  # still tied to the input embeddings
    torch.nn.init.zeros_(head.bias)
    model.set_output_embeddings(head)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return freeze(model, tok, name)


@torch.no_grad()
def calibrate_newline_bias(bb, prompts, step_tokens: float, temperature: float = 0.7, top_k: int = 50) -> dict:
    """Set the LM-head bias on newline ids so that P(newline) is about 1 / step_tokens per token."""
    from ctrls.data.prompts import newline_token_ids
    from ctrls.method.backbone import decoder_body

    head, dev = bb.lm_head, bb.device
    V = head.out_features
    nl = torch.zeros(V, dtype=torch.bool, device=dev)
    nl[[i for i in newline_token_ids(bb.tokenizer) if i < V]] = True
    hs = [decoder_body(bb.model)(input_ids=torch.as_tensor([p], device=dev)).last_hidden_state[0] for p in prompts[:2]]
    h = torch.cat(hs)[:: max(1, sum(len(x) for x in hs) // 512)][:512]
    logits = torch.cat([head(h[a:a + 128]).float() for a in range(0, len(h), 128)])
    target = 1.0 / step_tokens

    def p_newline(b: float) -> float:
        v, i = (logits + b * nl).topk(top_k, dim=-1)
        return float(((v / temperature).softmax(-1) * nl[i]).sum(-1).mean())

    lo, hi = 0.0, 1.0
    while p_newline(hi) < target and hi < 1e4:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_newline(mid) < target else (lo, mid)
    b = (lo + hi) / 2
    head.bias[nl] = b
    return {"bias": b, "target_newline_rate": target, "calibrated_rate": p_newline(b), "newline_ids": int(nl.sum())}


def shape_numbers(name: str) -> dict:
    """Parameters and bytes of the backbone's shape: instantiated on the ``meta`` device (no memory, no
    weights) from its config, the parameter count checked against the closed form."""
    from transformers import AutoModelForCausalLM

    cfg = backbone_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())  # the tied embedding counted once
    d, inter, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or d // H
    qkv_bias = (H + 2 * KV) * hd if SHAPES[name]["arch"] == "qwen2" else 0  # Qwen2 has q, k, v biases
    per_layer = d * H * hd + 2 * d * KV * hd + H * hd * d + qkv_bias + 3 * d * inter + 2 * d
    closed = V * d + L * per_layer + d
    if closed != params:
        raise AssertionError(f"{name}: {params} parameters on the meta device, {closed} by the closed form")
    return {"parameters": params, "embedding_parameters": V * d, "layers": L, "hidden": d, "intermediate": inter,
            "heads": H, "kv_heads": KV, "head_dim": hd, "vocab": V,
            "weight_bytes": BF16 * (params + V),  # bf16, with the LM-head bias this script adds
            "kv_bytes_per_token": L * 2 * KV * hd * BF16}
