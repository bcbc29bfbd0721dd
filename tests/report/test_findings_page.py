"""The first page: a three-sentence verdict a reader can repeat, with the scale caveat on the first
screen; then the findings as short sentences, each number with its 95% interval and n, a small table where
there are several; no first-page sentence over 40 words; no threshold the book does not justify.

``sentences`` splits a page's prose (Markdown, MyST) into sentences, leaving out what is not prose: code,
math blocks, tables, directive options, headings. ``tests/report/test_pagetext_prose.py`` uses it too."""
from __future__ import annotations

import re
from pathlib import Path

from ctrls.config.schema import load_config
from ctrls.report import findings as fd
from ctrls.report import paper_power
from ctrls.report import scorecard as sc
from ctrls.report.verdicts import OWN, Claim, Estimate

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
ABBREVIATIONS = ("Eq.", "Eqs.", "Sec.", "Alg.", "Thm.", "App.", "Fig.", "e.g.", "i.e.", "et al.", "vs.", "cf.", "no.",
                 "approx.", "Stat.", "Med.", "Res.", "Methods")


def prose(md: str) -> str:
    """The prose of a Markdown page: code blocks, math blocks, tables, headings, MyST targets and directive
    options left out (an admonition's body is prose and stays); roles reduced to their text."""
    out, fence, math = [], None, False
    for line in md.splitlines():
        s = line.strip()
        if math:
            math = not s.endswith("$$")
            continue
        if s.startswith("$$"):
            math = not (len(s) > 2 and s.endswith("$$"))
            continue
        m = re.match(r"^(`{3,}|:{3,})(\{[\w-]+\})?", s)
        if m:
            if fence is None:
                fence = (m.group(1), m.group(2) in ("{admonition}", "{note}", "{important}"))
            elif s == fence[0]:
                fence = None
            continue
        if fence is not None and not fence[1]:
            continue  # code, or a directive whose body is not prose
        if s.startswith(("|", "#", ":")) or re.match(r"^\(.*\)=$", s):
            continue
        out.append(line)
    return re.sub(r"\{[\w:-]+\}`([^`<]*?)\s*(<[^>]*>)?`", r"\1", "\n".join(out))  # {ref}`text <target>` -> text


def sentences(md: str) -> list[str]:
    """The sentences of a page's prose (:func:`prose`): split at a full stop, question or exclamation mark
    followed by a capital or a quote, never after an abbreviation (Eq., Sec., e.g., ...); list items and
    paragraphs end a sentence too."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.)\s)", prose(md)):
        text = " ".join(block.split())
        text = re.sub(r"^(?:[-*]|\d+\.)\s+", "", text)
        if not text:
            continue
        parts, start = [], 0
        for m in re.finditer(r"[.!?](?=\s+[\"“*(A-Z0-9`])", text):
            before = text[:m.end()]
            if before.endswith(ABBREVIATIONS) or re.search(r"\b[A-Z]\.$", before):
                continue
            parts.append(text[start:m.end()].strip())
            start = m.end()
        parts.append(text[start:].strip())
        out += [p for p in parts if p]
    return out


def words(sentence: str) -> int:
    return len(sentence.split())


def test_the_sentence_splitter():
    md = ("One two. Eq. 8 holds, e.g. here. Three?\n\n- a list item. And more.\n\n```python\nx = 1. Y\n```\n"
          "| a | b |\n\n$$\nx. Y\n$$\n\nLast {ref}`words <glossary-mdd>` here.")
    assert sentences(md) == ["One two.", "Eq. 8 holds, e.g. here.", "Three?", "a list item.", "And more.",
                             "Last words here."]


def _claims():
    return [Claim(sc.PASS_CLAIM, "Table 1", "ev", "not supported: the estimate is in the claimed direction (+15.0 points)",
                  "generated/02_exploration", claimed=sc.PASS_DIR, mdd=31.0,
                  estimates=[Estimate("word_problems eps=0.1 (η=0.7)", 0.15, -0.021, 0.309),
                             Estimate("gsm8k eps=0.1 (η=0.7)", 0.0, -0.386, 0.386)]),
            Claim(sc.ABLATION_CLAIM, "Sec. 6.2", "ev", "not supported: the estimate is in the claimed direction (+6.7 points)",
                  "generated/02_exploration", block=OWN, claimed=sc.ABLATION_DIR,
                  estimates=[Estimate("word_problems eps=0.1 − fixed s0 (η=0.7)", 0.067, -0.138, 0.264)],
                  beside=[Estimate("word_problems fixed s0 − Base (η=0.7)", 0.083, -0.131, 0.288)]),
            Claim(sc.CONTROL_CLAIM, "Eq. 8", "ev", "supported", "generated/02_exploration", block=OWN,
                  claimed=sc.CONTROL_DIR,
                  estimates=[Estimate("word_problems eps=0.1 κ", 0.17, 0.08, 0.26, scale=1.0, unit="")],
                  beside=[Estimate("word_problems fixed s0 − Base steps in s0", -0.23, -0.292, -0.162)]),
            Claim(sc.RL_CLAIM, "Alg. 2", "ev", "not supported: every estimate is in the claimed direction",
                  "generated/03_rl", claimed=sc.RL_DIR, mdd=40.0,
                  estimates=[Estimate("`none`", 0.04, -0.2, 0.28), Estimate("`both`", 0.08, -0.16, 0.32)])]


def _page(tmp_path) -> str:
    """The first page as a reader gets it: intro.md with its verdict and findings included."""
    cfg = load_config("demo")
    pw = paper_power.paired_p_columns(paper_power.paper_power())
    counts = sc.paper_power_counts(pw)
    sizes = {"questions": {"word_problems": 60, "gsm8k": 8},
             "rl": {"none": {"seeds": 3, "steps": 20, "questions": 12, "samples": 2},
                    "both": {"seeds": 3, "steps": 20, "questions": 12, "samples": 2}}}
    verdict = fd.verdict_markdown(fd.verdict_sentences(cfg, _claims(), counts))
    findings = fd.findings_markdown(fd.findings(cfg, _claims(), counts, sizes=sizes), "/generated/paper_forest.png",
                                    fd.paper_table_markdown(pw))
    intro = (BOOK / "intro.md").read_text()
    intro = intro.replace("```{include} generated/verdict.md\n```", verdict)
    return intro.replace("```{include} generated/findings.md\n```", findings)


def test_no_first_page_sentence_is_over_40_words(tmp_path):
    page = _page(tmp_path)
    long = [s for s in sentences(page) if words(s) > fd.MAX_WORDS]
    assert not long, "\n\n".join(f"{words(s)} words: {s}" for s in long)


def test_the_verdict_is_three_sentences_on_the_first_screen_with_the_scale_caveat(tmp_path):
    page = _page(tmp_path)
    verdict = page[page.index("```{admonition} The verdict"):]
    verdict = verdict[:verdict.index("\n```\n")]
    said = sentences(verdict.split("\n", 2)[2])
    assert len(said) == 3, said
    assert "3B scale" in said[1]
    first_screen = page[:page.index("## What this book finds")]
    assert len(first_screen.split()) < 250 and "3B scale" in first_screen


def test_each_finding_gives_its_numbers_with_interval_and_n(tmp_path):
    page = _page(tmp_path)
    findings = page[page.index("## What this book finds"):page.index("## Claims scorecard")]
    for number in ("↑ +15.0 [−2.1, +30.9]", "↑ +0.17 [+0.08, +0.26]", "↑ +4.0 [−20.0, +28.0]"):
        assert number in findings, number
    assert "| word_problems eps=0.1 (η=0.7) − Base | CTRLS against Base (the paper's claim) | 60 |" in findings
    assert "| `none` | 3 × 20 | 12 × 2 |" in findings
    assert "| Table 1 | 40 |" in findings and "| Table 2 | 500 |" in findings  # the paper's n, inferred


def test_no_threshold_the_book_does_not_justify(tmp_path):
    page = _page(tmp_path)
    assert "40%" not in page and "3×" not in page and "would need" not in page
    assert "None reaches" not in page


def test_the_papers_n_is_always_said_to_be_inferred(tmp_path):
    page = _page(tmp_path)
    for m in re.finditer(r"n = (40|500)\b", page):
        near = page[max(0, m.start() - 200):m.end() + 200]
        assert "infer" in near, near
