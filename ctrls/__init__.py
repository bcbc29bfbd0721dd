"""CTRLS: Chain-of-Thought Reasoning via Latent State Transition (AISTATS 2026), reproduced.

The package is a house of floors; each imports only the floors below it (``tests/repo/test_imports.py``):

    errors < stats < data < method < generate < config < synthetic < stages < report < cli

The names below are loaded on first use, so ``import ctrls`` does not import torch.
"""
import importlib as _importlib
import warnings as _warnings

# tqdm.auto in a notebook without ipywidgets falls back to text bars, and says so on every page of
# the book; the bars are fine (install ipywidgets for widget bars)
_warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

__version__ = "0.1.0"

_LAZY = {  # public name -> the module that defines it
    "Backbone": "ctrls.method.backbone",
    "load_backbone": "ctrls.method.backbone",
    "Config": "ctrls.config.schema",
    "ConfigError": "ctrls.errors",
    "load_config": "ctrls.config.schema",
    "CTRLSModel": "ctrls.method.model",
    "sample": "ctrls.stages.finished",  # a loaded run's conditioning, or a backbone's (ctrls.generate.sampling)
    "pretrain": "ctrls.stages.pretrain",
    "explore": "ctrls.stages.exploration",
    "run_rl": "ctrls.stages.rl",
    "load_run": "ctrls.stages.finished",
    "LoadedRun": "ctrls.stages.finished",
    "SampleParams": "ctrls.generate.sampling",
    "Conditioning": "ctrls.generate.conditioning",  # Base; the three below condition on the latent state
    "AdapterConditioning": "ctrls.generate.conditioning",
    "StatePromptConditioning": "ctrls.generate.conditioning",
    "LockstepConditioning": "ctrls.generate.conditioning",
    "encode_prompt": "ctrls.data.prompts",
    "load_pretrained": "ctrls.stages.pretrain",
    "load_samples": "ctrls.stages.exploration",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once: later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'ctrls' has no attribute {name!r}")


def __dir__():
    return sorted({n for n in globals() if not n.startswith("_")} | set(_LAZY))
