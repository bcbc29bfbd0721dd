"""CTRLS: Chain-of-Thought Reasoning via Latent State Transition (AISTATS 2026), reproduced."""
import warnings

# tqdm.auto in a notebook without ipywidgets falls back to text bars, and says so on every page of
# the book; the bars are fine (install ipywidgets for widget bars)
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

from ctrls.backbone import Backbone, load_backbone  # noqa: E402
from ctrls.config import Config, ConfigError, load_config

__all__ = ["Backbone", "Config", "ConfigError", "load_backbone", "load_config"]
__version__ = "0.1.0"
