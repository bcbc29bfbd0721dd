"""Errors every floor of the library may raise: the bottom floor, it imports nothing of ctrls."""


class ConfigError(ValueError):
    """A configuration key is unknown, or its value has the wrong type or is not allowed."""


def says_full_disk(e: BaseException) -> bool:
    """Whether ``e``'s message reports a full disk: the OS's text, or safetensors' own error (OS error 28)."""
    return "No space left on device" in str(e) or "os error 28" in str(e)
