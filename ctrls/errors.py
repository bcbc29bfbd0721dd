"""Errors every floor of the library may raise: the bottom floor, it imports nothing of ctrls."""


class ConfigError(ValueError):
    """A configuration key is unknown, or its value has the wrong type or is not allowed."""
