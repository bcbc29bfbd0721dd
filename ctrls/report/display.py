"""How the book's pages show a DataFrame: whole, without the pandas index, constant columns said once.

``install()`` (called by ``ctrls.report.provenance.notebook_config``, so by every notebook) registers
:func:`frame_html` as IPython's HTML formatter for DataFrames. A table on a page then:

* is shown in full: never pandas's "… 80 rows × 16 columns", never a cell cut to "…";
* has no index column when its index is pandas's default 0, 1, 2, ..., or what is left of it after
  a filter (1, 3, 4) (a named or labelled index, such as Table 1's rows, is kept);
* says once, above it, the columns whose value is the same in every row (backbone, dataset,
  questions, ...), which are then dropped from the table (tables of 2 rows or more, flat columns);
* shows a missing value as "—", never ``nan``/``None``, a truth value as "yes" or "no", a p-value column
  (by its name: "p", "p (Holm)", ...) as ``ctrls.stats.metrics.format_p`` prints it, and each other float to at most 3 significant
  digits (4 at 1000 and above), which is more than any interval in this book supports;
* is preceded by ``df.attrs["note"]`` when the frame has one (e.g. why a table's columns were left
  out because every value in them was equal).

``frame_html`` is a pure function of the frame: tests call it directly.
"""
from __future__ import annotations

import html
import math
import numbers
import re

import numpy as np
import pandas as pd

MISSING = "—"


def fmt(v) -> str:
    """One cell: ``—`` for a missing value, "yes"/"no" for a truth value, floats to 3 significant digits, the
    rest as ``str``."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        x = float(v)
        if math.isinf(x):
            return "∞" if x > 0 else "−∞"
        if x == int(x) and abs(x) < 1e6:
            return str(int(x))
        return f"{x:.4g}" if abs(x) >= 1000 else f"{x:.3g}"
    try:
        if pd.isna(v):
            return MISSING
    except (TypeError, ValueError):  # lists, arrays: not a scalar
        pass
    return str(v)


def and_list(items) -> str:
    """Items as a reader writes them: "0", "0 and 1", "0, 1 and 2" (never a Python list's "[0, 1, 2]")."""
    names = [str(x) for x in items]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}" if names else ""


def constant_columns(df: pd.DataFrame, min_rows: int = 2) -> dict[str, str]:
    """The flat columns whose formatted value is the same in every row (frames of ``min_rows``+ rows),
    never all of them."""
    if len(df) < min_rows or isinstance(df.columns, pd.MultiIndex):
        return {}
    out = {}
    for c in df.columns:
        vals = {fmt(v) for v in df[c]}
        if len(vals) == 1:
            out[str(c)] = vals.pop()
    # keep at least two columns (or all there are): a table, not a sentence; the last columns (the
    # results, in this book's tables) stay
    for c in reversed([str(c) for c in df.columns]):
        if len(df.columns) - len(out) >= min(2, len(df.columns)):
            break
        out.pop(c, None)
    return out


def _default_index(df: pd.DataFrame) -> bool:
    """pandas's own row numbers: a RangeIndex, or an unnamed increasing integer index (what is left of
    one after rows were filtered out: 1, 3, 4), never a label of the reader's."""
    idx = df.index
    if idx.name is not None or isinstance(idx, pd.MultiIndex):
        return False
    return isinstance(idx, pd.RangeIndex) or list(idx) == list(range(len(idx))) or \
        (pd.api.types.is_integer_dtype(idx) and idx.is_unique and idx.is_monotonic_increasing)


def is_p_column(name) -> bool:
    """Whether a column holds p-values by its name: "p", "p (Holm)", "p (κ, Holm)", "Δκ p (Holm)", "p, minimal
    discordance", "p-value"."""
    return bool(re.search(r"(^|\s)p(\s*[(,]|$)|^p-value", str(name)))


def p_text(v) -> str:
    """A p-value cell: :func:`ctrls.stats.metrics.format_p`, "—" when missing."""
    from ctrls.stats.metrics import format_p

    return MISSING if v is None or (isinstance(v, float) and math.isnan(v)) else format_p(float(v))


def frame_html(df: pd.DataFrame) -> str:
    """The page's HTML for ``df`` (see the module docstring)."""
    const = constant_columns(df)
    shown = df.drop(columns=[c for c in df.columns if str(c) in const]) if const else df
    head = f"<p class='ctrls-note'>{html.escape(str(df.attrs['note']))}</p>" if df.attrs.get("note") else ""
    if const:
        items = " · ".join(f"{html.escape(k)}: <b>{html.escape(v)}</b>" for k, v in const.items())
        head += f"<p class='ctrls-constant'>In every row: {items}</p>"
    styled = shown.style.format(fmt)
    pcols = [c for c in shown.columns if is_p_column(c) and pd.api.types.is_float_dtype(shown[c])]
    if pcols:  # a p-value the one way the book prints it: "<1e-4", never "1.52e-24"
        styled = styled.format(p_text, subset=pcols)
    if _default_index(shown):
        styled = styled.hide(axis="index")
    else:
        styled = styled.format_index(fmt, axis="index")
    styled = styled.format_index(fmt, axis="columns")
    with pd.option_context("styler.render.max_elements", 10_000_000, "styler.render.max_rows", None,
                           "styler.render.max_columns", None):
        table = styled.set_table_attributes("class='dataframe ctrls-table'").to_html()
    return f"<div class='ctrls-frame'>{head}{table}</div>"


def install() -> bool:
    """Register :func:`frame_html` for DataFrames in the running IPython kernel (no-op outside one)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of the notebooks only
        return False
    ip = get_ipython()
    if ip is None:
        return False
    ip.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)
    return True
