"""ctrls.errors: ConfigError is the one error a bad configuration raises, a ValueError (so a caller catching
ValueError catches it), the same class wherever it is imported from, and its module imports nothing of ctrls
(every floor of the library may raise it)."""
import ast
from pathlib import Path

import pytest

from ctrls.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_a_config_error_is_a_value_error_carrying_its_message():
    e = ConfigError("config key 'a': 1 is not allowed")
    assert isinstance(e, ValueError) and str(e) == "config key 'a': 1 is not allowed"
    with pytest.raises(ValueError, match="config key 'a'"):
        raise e


def test_a_bad_config_raises_the_one_config_error_class():
    from ctrls.config import schema
    from ctrls.config.schema import load_config

    assert schema.ConfigError is ConfigError
    with pytest.raises(ConfigError, match=r"config key 'pretrain\.epochs'"):
        load_config("smoke", ["pretrain.epochs=many"])


def test_the_errors_module_imports_nothing_of_ctrls():
    tree = ast.parse((ROOT / "ctrls" / "errors.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m == "ctrls" or m.startswith("ctrls.")]
