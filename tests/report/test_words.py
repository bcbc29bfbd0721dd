"""ctrls.report.words: the book's phrases, read from book/_templates, and its formats of numbers."""

import pytest

from ctrls.report import words


def test_diff_ci_rate_n_and_format_p():
    assert words.diff_ci(0.15, -0.021, 0.309) == "+15.0 [−2.1, +30.9]"
    assert words.diff_ci(0.17, 0.05, 0.29, scale=1, arrow="↑") == "↑ +0.17 [+0.05, +0.29]"
    assert words.diff_ci(float("nan"), 0, 1) == "not computed"
    assert words.rate_n(0.358, 120, 0.281, 0.442) == "35.8% [28.1, 44.2] (n = 120 questions)"
    assert words.format_p(1.52e-24) == "<1e-4"


def test_every_template_block_fills_and_refuses_a_missing_field():
    blocks = words.phrases("findings")
    assert "verdict.box" in blocks and "unmeasured.not run" in blocks
    assert words.say("findings", "mdd", mdd=12).startswith(" At this size the test detects about 12 points")
    with pytest.raises(KeyError, match="no value for"):
        words.say("findings", "mdd")
    for name in ("findings",):
        for key, text in words.phrases(name).items():
            assert "<!--" not in text, (name, key)


def test_every_phrase_the_code_asks_for_is_in_its_template():
    import re
    from pathlib import Path

    root = Path(words.__file__).resolve().parents[2]
    asked = set()
    for path in [*(root / "ctrls" / "report").glob("*.py"), *(root / "bench" / "gpu").rglob("*.py")]:
        asked |= set(re.findall(r'say\("(\w+)", "([^"]+)"[,)]', path.read_text(encoding="utf-8")))
    assert asked, "no phrase asked for"
    missing = sorted((name, key) for name, key in asked if key not in words.phrases(name))
    assert not missing, missing
    for template in words.TEMPLATES.glob("*.md"):
        assert words.phrases(template.stem), template.name


def test_every_glossary_link_of_the_templates_resolves():
    import re

    from ctrls.report.glossary import ANCHORS

    for template in words.TEMPLATES.glob("*.md"):
        for anchor in re.findall(r"<(glossary-[\w-]+)>", template.read_text(encoding="utf-8")):
            assert anchor in ANCHORS.values(), (template.name, anchor)
