"""The plumbing every stage shares, written once: sampling parameters from the config and the
backbone on this rank's device. (Seeds: ``ctrls.streams.seed_of``; file names: ``ctrls.runs``.)
"""
from __future__ import annotations

from ctrls.backbone import Backbone, load_backbone
from ctrls.config import Config
from ctrls.distributed import world
from ctrls.sampling import SampleParams


def sample_params(cfg: Config, temperature: float, **changes) -> SampleParams:
    """``SampleParams`` from ``sampling`` and ``prompt`` keys at temperature eta, with ``changes``
    (``epsilon``, ``transitions``, ...) on top."""
    s = cfg.sampling
    return SampleParams(temperature=temperature, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
                        max_steps=cfg.prompt.max_steps, batch_size=s.batch_size, decode=s.decode,
                        compile=s.compile, **changes)


def backbone_for(cfg: Config, name: str | None = None) -> Backbone:
    """The backbone ``name`` (default ``backbone.name``) with the config's dtype and cache, on this
    rank's device (``ctrls.distributed``: ``cuda:<local rank>`` when launched on several GPUs)."""
    b = cfg.backbone
    return load_backbone(name or b.name, world().device(b.device), b.dtype, b.cache_dir)
