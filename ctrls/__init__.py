"""CTRLS: Chain-of-Thought Reasoning via Latent State Transition (AISTATS 2026), reproduced."""
from ctrls.backbone import Backbone, load_backbone
from ctrls.config import Config, ConfigError, load_config

__all__ = ["Backbone", "Config", "ConfigError", "load_backbone", "load_config"]
__version__ = "0.1.0"
