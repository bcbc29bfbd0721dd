"""Links into the book's glossary (``book/glossary.md``): each term is defined there once, under a MyST
target ``(glossary-...)=``, and the pages link to it with :func:`term` instead of explaining it again.
``tests/report/test_glossary.py`` checks that every anchor here, and every ``glossary-`` link in the
book's pages and notebooks, resolves to a target of the glossary page."""
from __future__ import annotations

ANCHORS = {
    "pass@k": "glossary-pass-at-k",
    "Succ.": "glossary-succ",
    "Wilson": "glossary-wilson",
    "Newcombe": "glossary-newcombe",
    "Holm": "glossary-holm",
    "family interval": "glossary-holm",
    "verdicts": "glossary-verdicts",
    "MDD": "glossary-mdd",
    "inferred n": "glossary-inferred-n",
    "fixed s0": "glossary-fixed-s0",
    "coincidence": "glossary-coincidence",
    "kappa": "glossary-kappa",
    "epsilon": "glossary-epsilon",
    "how to change": "glossary-how-to-change",
}


def term(key: str, text: str | None = None) -> str:
    """A MyST link to the glossary's entry for ``key`` (an :data:`ANCHORS` key), showing ``text``
    (default: the key itself): ``{ref}`MDD <glossary-mdd>```."""
    if key not in ANCHORS:
        raise KeyError(f"no glossary entry {key!r}; the glossary has {sorted(ANCHORS)}")
    return f"{{ref}}`{text or key} <{ANCHORS[key]}>`"


__all__ = ["ANCHORS", "term"]
