"""Issue 34, reliability round 3: repeated setting keys, YAML 1.1 numbers, over-long names, judge
scales, one-line CLI errors."""
import pytest

from ctrls.config import ConfigError, load_config
from ctrls.settings import parse_setting


@pytest.mark.parametrize("name", ["eps=0.1,eps=0.2", "eps=0.1,epsilon=0.1", "H=0.01,alpha=0.02",
                                  "eps=0.1,H=0.01,H=0.02"])
def test_a_setting_with_a_repeated_key_is_refused(name):
    cfg = load_config("smoke")
    with pytest.raises(ValueError, match="twice"):
        parse_setting(name, cfg)
    assert parse_setting("eps=0.1,H=0.01", cfg).epsilon == 0.1


def test_a_config_setting_with_a_repeated_key_is_a_config_error():
    with pytest.raises(ConfigError, match=r"rl\.settings\[0\]"):
        load_config("smoke", ['rl.settings=["eps=0.1,eps=0.2"]'])
