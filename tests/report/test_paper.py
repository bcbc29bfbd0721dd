"""The paper cited by its own numbering.

(a) ``ctrls.report.paper``'s tables of the paper's sections, appendices, figures, tables, algorithms and
    equations against the LaTeX source (skipped where the source is not there: users do not have it).
(b) The book's pages and the notebooks' markdown: a reference ("Sec. 6.3", "Appendix E", "Figures
    3, 6 and 7", "App. C.1") next to a topic it is known for (the judge, the case studies, the RL
    curves, the exploration configurations, ...) must be the paper's number for that topic.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ctrls.report.paper import (
    PAPER_ALGORITHMS,
    PAPER_EQUATIONS,
    PAPER_FIGURES,
    PAPER_REFS,
    PAPER_SECTIONS,
    PAPER_TABLES,
    ref_targets,
)

ROOT = Path(__file__).resolve().parents[2]
TEX = ROOT.parent / "shared" / "paper" / "ctrls_paper.tex"


# ---- (a) the numbering against the LaTeX --------------------------------------------------------

def _strip_comments(text: str) -> str:
    return "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in text.splitlines())


def resolve_inputs(text: str) -> str:
    """The document with every \\input{name} replaced by that file's text. The source is one file
    of concatenated files, each opened by a line "%% file: PATH"; the first is the main file."""
    parts = re.split(r"^%% file: (\S+)\n", text, flags=re.M)
    if len(parts) == 1:
        return text
    files = dict(zip(parts[1::2], parts[2::2]))
    main = files.get("main.tex", parts[2])

    def expand(src: str, depth: int = 0) -> str:
        assert depth < 10, "\\input nested too deep"
        return re.sub(r"\\input\{([^}]*)\}",
                      lambda m: expand(files.get(m.group(1) if m.group(1).endswith(".tex") else m.group(1) + ".tex",
                                                 ""), depth + 1), src)

    return expand(main)


def _braced(text: str, start: int) -> str:
    """The contents of the {...} group opening at text[start]."""
    assert text[start] == "{"
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    raise ValueError("unbalanced braces")


def _plain(tex: str) -> str:
    tex = re.sub(r"\\(?:textbf|textit|emph|texttt)\{([^{}]*)\}", r"\1", tex)
    tex = tex.replace("$\\epsilon$", "ε").replace("~", " ")
    return " ".join(tex.split())


def parse_numbering(text: str) -> dict:
    """Sections, floats and numbered equations of a LaTeX document, numbered as LaTeX would."""
    text = _strip_comments(resolve_inputs(text))
    body = text[text.index("\\begin{document}"):]
    sections, figures, tables, algorithms, equations = {}, {}, {}, {}, {}
    sec = sub = 0
    appendix = False
    token = re.compile(r"\\(section|subsection)\*?\{|\\appendix\b|\\begin\{(figure\*?|table\*?|algorithm|"
                       r"equation|multline|align)\}")
    pos = 0
    while (m := token.search(body, pos)) is not None:
        pos = m.end()
        if m.group(0).startswith("\\appendix"):
            appendix, sec, sub = True, 0, 0
        elif m.group(1) == "section":
            sec, sub = sec + 1, 0
            sections[chr(ord("A") + sec - 1) if appendix else str(sec)] = _plain(_braced(body, m.end() - 1))
        elif m.group(1) == "subsection":
            sub += 1
            key = chr(ord("A") + sec - 1) if appendix else str(sec)
            sections[f"{key}.{sub}"] = _plain(_braced(body, m.end() - 1))
        else:
            env = m.group(2)
            end = body.index(f"\\end{{{env}}}", m.end())
            inner = body[m.end():end]
            pos = end
            if env.rstrip("*") in ("figure", "table", "algorithm"):
                # the float's own caption: the last one, after any subfigures
                inner = re.sub(r"\\begin\{subfigure\}.*?\\end\{subfigure\}", "", inner, flags=re.S)
                caps = [_plain(_braced(inner, c.end() - 1)) for c in re.finditer(r"\\caption\{", inner)]
                store = {"figure": figures, "table": tables, "algorithm": algorithms}[env.rstrip("*")]
                store[len(store) + 1] = caps[-1]
            else:
                label = re.search(r"\\label\{([^}]*)\}", inner)
                rows = [inner] if env != "align" else re.split(r"\\\\", inner)
                numbered = [r for r in rows if "\\nonumber" not in r and "\\notag" not in r]
                for i, _ in enumerate(numbered):
                    equations[len(equations) + 1] = label.group(1) if label and i == 0 else None
    return {"sections": sections, "figures": figures, "tables": tables, "algorithms": algorithms,
            "equations": equations}


@pytest.fixture(scope="module")
def latex():
    if not TEX.exists():
        pytest.skip(f"the paper's LaTeX is not at {TEX}")
    return parse_numbering(TEX.read_text())


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower().replace("ε", "epsilon")).strip()


def test_sections_and_appendices_match_the_latex(latex):
    assert latex["sections"] == PAPER_SECTIONS


@pytest.mark.parametrize("kind", ["figures", "tables", "algorithms"])
def test_floats_match_the_latex_in_order(latex, kind):
    ours = {"figures": PAPER_FIGURES, "tables": PAPER_TABLES, "algorithms": PAPER_ALGORITHMS}[kind]
    assert sorted(latex[kind]) == sorted(ours)
    for n, caption in ours.items():
        assert _norm(latex[kind][n]).startswith(_norm(caption)), (kind, n, latex[kind][n])


def test_equation_numbers_and_labels_match_the_latex(latex):
    assert sorted(latex["equations"]) == sorted(PAPER_EQUATIONS)
    for n, (_, label) in PAPER_EQUATIONS.items():
        assert latex["equations"][n] == label, (n, latex["equations"][n], label)


def test_the_parser_counts_a_small_document():
    doc = r"""\begin{document}
\section{One}\begin{equation}a\end{equation}\begin{equation*}b\end{equation*}
\begin{figure}\begin{subfigure}\caption{sub}\end{subfigure}\caption{First figure}\end{figure}
\subsection{Two}\begin{align}\label{eq:x} a \nonumber \\ b \\ c\end{align}
% \section{Commented out}
\appendix\section{Extra}\subsection{More}\begin{table}\caption{A table}\end{table}
\end{document}"""
    got = parse_numbering(doc)
    assert got["sections"] == {"1": "One", "1.1": "Two", "A": "Extra", "A.1": "More"}
    assert got["figures"] == {1: "First figure"} and got["tables"] == {1: "A table"}
    assert got["equations"] == {1: None, 2: "eq:x", 3: None}


def test_every_paper_ref_names_something_the_paper_has():
    known = {"Sec": set(PAPER_SECTIONS), "App": set(PAPER_SECTIONS), "Fig": {str(n) for n in PAPER_FIGURES},
             "Table": {str(n) for n in PAPER_TABLES}, "Alg": {str(n) for n in PAPER_ALGORITHMS},
             "Eq": {str(n) for n in PAPER_EQUATIONS}, "Thm": {"5.3"}}
    for topic, ref in PAPER_REFS.items():
        for kind, num in ref_targets(ref):
            assert num in known[kind], (topic, ref)
            if kind == "Sec":
                assert num[0].isdigit(), (topic, ref)
            if kind == "App":
                assert num[0].isalpha(), (topic, ref)


def test_paper_refs_spot_checks():
    assert (PAPER_SECTIONS["6.3"] == "Impact of Exploration Configurations"
            == PAPER_SECTIONS[PAPER_REFS["exploration configurations"][5:]])
    assert PAPER_REFS["judge"] == "App. E" and PAPER_SECTIONS["E"].startswith("GPT-as-judge")
    assert PAPER_REFS["RL learning curves"] == "App. C.1" and PAPER_REFS["RL learning curves figures"] == "Figs. 4-5"
    assert ref_targets(PAPER_REFS["case study figures"]) == [("Fig", "3"), ("Fig", "6"), ("Fig", "7")]


# ---- (b) the references in the book and the notebooks --------------------------------------------

def _allowed(*topics: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for t in topics:
        for kind, num in ref_targets(PAPER_REFS[t]):
            out.setdefault(kind, set()).add(num)
    return out


# topic: (keyword pattern, the references allowed next to it, by kind; kinds not listed are not checked)
TOPICS = {
    "judge": (r"\bjudge|rubric|GPT-4|GPT-as-judge|hallucinat",
              _allowed("judge", "judge table", "case study")),
    "case studies": (r"case stud|case question|qualitative",
                     _allowed("case study", "case study examples", "case study figures")),
    "exploration configurations": (r"exploration configuration",
                                   _allowed("exploration configurations", "RL table")),
    "RL curves": (r"learning curve|RL curve|\bcollapse|four (?:settings|curves)",
                  {"App": {"C", "C.1"}, **_allowed("RL learning curves figures")}),
    "implementation details": (r"implementation detail", _allowed("implementation details")),
    "ELBO derivation": (r"derivation of the (?:ELBO|bound)|ELBO derivation", _allowed("ELBO derivation")),
}

REF = re.compile(
    r"\b(?P<kind>Sections?|Secs?\.|§|Appendix|Appendices|Apps?\.|Figures?|Figs?\.)\s*"
    r"(?P<nums>[A-Z0-9](?:\.\d+)?(?:\s*(?:[-–]|,|and|&)\s*[A-Z0-9](?:\.\d+)?)*)\b")
KIND = {"sec": "Sec", "§": "Sec", "app": "App", "fig": "Fig"}
WINDOW = 120  # characters either side of a reference in which a topic keyword counts as "next to" it


def parse_refs(text: str) -> list[tuple[int, str, list[str]]]:
    """(offset, kind, numbers) for each reference in ``text``."""
    out = []
    for m in REF.finditer(text):
        kind = KIND[m.group("kind").lower()[:3] if m.group("kind") != "§" else "§"]
        nums = []
        for a, dash, b in re.findall(r"([A-Z0-9](?:\.\d+)?)(?:\s*([-–])\s*([A-Z0-9](?:\.\d+)?))?", m.group("nums")):
            if dash and a.isdigit() and b.isdigit():
                nums += [str(i) for i in range(int(a), int(b) + 1)]
            else:
                nums += [a] + ([b] if b else [])
        if kind == "Sec" and nums and nums[0][0].isalpha():
            kind = "App"  # "Section D"
        out.append((m.start(), kind, nums))
    return out


def wrong_refs(text: str) -> list[str]:
    """Each reference in ``text`` that is not the paper's number for a topic named next to it."""
    bad = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        for at, kind, nums in parse_refs(flat):
            near = flat[max(0, at - WINDOW):at + WINDOW]
            for topic, (pattern, allowed) in TOPICS.items():
                if kind in allowed and re.search(pattern, near, re.I):
                    for n in nums:
                        if n not in allowed[kind]:
                            bad.append(f"{kind} {n} next to {topic!r} (the paper: {sorted(allowed[kind])}): "
                                       f"...{flat[max(0, at - 60):at + 60]}...")
    return bad


def prose_sources() -> dict[str, str]:
    out = {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "book").glob("*.md"))}
    for p in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        for i, c in enumerate(cells):
            if c["cell_type"] == "markdown":
                out[f"{p.relative_to(ROOT)}#cell{i}"] = "".join(c["source"])
    return out


def test_the_scanner_catches_the_known_errors_and_passes_the_fixes():
    wrong = ["Appendix D of the paper scores 100 sampled solutions with GPT-4.",
             "# Case studies (Figures 5–7)",
             "The paper's RL curves (App. F) show the collapse without entropy.",
             "the exploration configurations of Sec. 6.4",
             "the paper's four settings (Section F)"]
    right = ["Appendix E of the paper scores 100 sampled solutions with GPT-4.",
             "# Case studies (Figures 3, 6 and 7)",
             "The paper's RL curves (App. C.1, Figures 4–5) show the collapse without entropy.",
             "the exploration configurations of Sec. 6.3 (Table 2)",
             "correct chains are kept (App. F)"]
    for text in wrong:
        assert wrong_refs(text), text
    for text in right:
        assert not wrong_refs(text), (text, wrong_refs(text))
    assert parse_refs("Figures 3, 6 and 7") == [(0, "Fig", ["3", "6", "7"])]
    assert parse_refs("Figs. 4-5") == [(0, "Fig", ["4", "5"])]
    assert parse_refs("App. C.1") == [(0, "App", ["C.1"])]


@pytest.mark.parametrize("name", sorted(prose_sources()))
def test_the_book_cites_the_paper_by_its_numbering(name):
    assert not wrong_refs(prose_sources()[name])


def test_the_book_names_the_case_studies_by_the_papers_figures():
    nb = "".join(prose_sources()[k] for k in prose_sources() if k.startswith("notebooks/05_case_studies"))
    refs = {n for _, kind, nums in parse_refs(nb) if kind == "Fig" for n in nums}
    assert refs >= {"3", "6", "7"}, refs


EQ_TOPICS = {  # keyword -> the paper's equation numbers allowed next to it
    r"U-Net|adapter|injection": {"8"},
    r"\bentropy\b": {"14", "15", "16"},
    r"REINFORCE|policy gradient|score[- ]function": {"15", "16"},
}


def wrong_equation_refs(text: str) -> list[str]:
    bad = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        for m in re.finditer(r"\bEqs?\.\s*(\d+)(?:\s*[-–]\s*(\d+))?", flat):
            nums = [str(i) for i in range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)]
            near = flat[max(0, m.start() - 60):m.end() + 60]
            # a number is wrong when topics are near and it is none of theirs (several topics can share a sentence)
            topics = [(pattern, allowed) for pattern, allowed in EQ_TOPICS.items() if re.search(pattern, near, re.I)]
            ok = set().union(*(allowed for _, allowed in topics)) if topics else set()
            bad += [f"Eq. {n} next to {[p for p, _ in topics]} (the paper: {sorted(ok)}): ...{near}..."
                    for n in nums if topics and n not in ok]
    return bad


def test_the_equation_scanner():
    assert wrong_equation_refs("the U-Net adapter (Eq. 7)") and not wrong_equation_refs("the U-Net adapter (Eq. 8)")
    assert wrong_equation_refs("the entropy (Eq. 13)") and not wrong_equation_refs("the entropy (Eq. 14)")
    assert not wrong_equation_refs("REINFORCE with the entropy of Eq. 14 and the gradient of Eq. 16")
    assert wrong_equation_refs("REINFORCE with the entropy of Eq. 13")


def test_the_book_cites_equations_by_the_papers_numbering():
    bad = [f"{name}: {b}" for name, text in prose_sources().items() for b in wrong_equation_refs(text)]
    assert not bad, "\n".join(bad)
