"""Configuration: one typed config from a named profile to every stage, checked at load.

Floor 5: above the algorithms (which take tensors, never a config) and below the stages that wire it.

- ``schema``: the :class:`Config` dataclass tree, ``load_config`` and overrides applied;
- ``checks``, ``rules``: the allowed values of each key and the checks across keys;
- ``overrides``: dotted ``key=value`` overrides and the YAML reader;
- ``settings``: the RL settings grammar and the table labels;
- ``explain``: each key's docstring, read from the schema's source (``ctrls config --explain KEY``);
- ``profiles/``: ``smoke``, ``demo`` and ``paper`` as YAML.

A new key: declare it in ``schema`` with ``key(default, rule)`` and a docstring on the line under it.
"""
from ctrls.config.schema import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "load_config"]
