"""The mechanism studies behind the pretraining page: the stored ``studies/`` results that ask whether the state
steers the step (``studies/steering.py``: training chains, the K sweep, the fusion of F_u; ``studies/injection.py``:
the injection point; ``studies/concentration.py``), read, checked and put into tables and sentences.

Nothing here recomputes a study: each reader takes a stored JSON result, read and checked by
:mod:`ctrls.report.stored` (its schema per kind of file; a bad one is a ``StoredResultError`` naming the file
and the field), and returns a frame whose ``attrs`` carry the commit and the machine it ran on. The stored
results are found under a ``root`` given to the ``*_result_path(s)`` functions, else ``$CTRLS_RESULTS_DIR``,
else the repository.
The K sweep's harm rule (``HARM_GOAL``) and Cohen's kappa of following a drawn state against coincidence
(``chance_corrected``) live here too. The controls themselves (log P per token under
each state condition, Eq. 8's adapter) are :mod:`ctrls.method.controls`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

import numpy as np

from ctrls.report.stored import read as read_stored
from ctrls.report.stored import stored_result  # the stored result ``rel`` under a root, or None

# ---- steering against the number of training chains (studies/steering.py) ---------------------------


def stored_results(rels, root=None) -> list:
    """Those of the stored results ``rels`` that exist under ``root`` (:func:`stored_result`), in order."""
    return [p for p in (stored_result(r, root) for r in rels) if p is not None]


SCALING_RESULT = "studies/results/steering_scaling.json"  # at K = 16 (the demo's K before the K sweep)
SCALING_RESULTS = (SCALING_RESULT, "studies/results/steering_scaling_k4.json")  # ... and at the demo's K = 4


def scaling_result_paths(root=None) -> list:
    """Every stored data-scaling result of ``SCALING_RESULTS`` that the repository holds (one per K)."""
    return stored_results(SCALING_RESULTS, root)


def _fusion(point: dict) -> str:
    """The adapter's fusion (``adapter.fusion``) of a ``studies/steering.py`` point: recorded since the fusion
    comparison, else read from its overrides, else the demo profile's (linear)."""
    if "fusion" in point:
        return str(point["fusion"])
    given = [o.split("=", 1)[1] for o in point.get("overrides", []) if o.startswith("adapter.fusion=")]
    return given[-1] if given else "linear"


def scaling_frame(path) -> "pd.DataFrame":
    """The points of a ``studies/steering.py`` result: one row per number of training chains, with the
    epsilon row's follows-its-state rate and its coincidence reference, and pass@1 differences to Base
    (fixed s0 and epsilon), each with its 95% interval. A missing file or field is a clear error.
    A list of paths gives their points together (sorted by chains, then K), with ``attrs["stored"]``
    one ``{"path", "commit", "machine", "overrides"}`` per file."""
    from pathlib import Path

    import pandas as pd

    if isinstance(path, (list, tuple)):
        if not path:
            raise ValueError("scaling_frame: no result paths given")
        frames = [scaling_frame(p).assign(stored=i) for i, p in enumerate(path)]
        df = pd.concat(frames, ignore_index=True).sort_values(["chains", "K"]).reset_index(drop=True)
        df.attrs.update({"commit": ", ".join(dict.fromkeys(f.attrs["commit"] for f in frames)),
                         "machine": frames[0].attrs["machine"], "overrides": frames[0].attrs["overrides"],
                         "stored": [{"path": str(p), **{k: f.attrs[k] for k in ("commit", "machine", "overrides")}}
                                    for p, f in zip(path, frames)]})
        return df
    path = Path(path)
    res = read_stored(path, "steering")  # checked: types, finite numbers, ranges, intervals, K (ctrls.report.stored)
    try:
        rows = [{"chains": p["chains"], "train_questions": p["train_questions"], "sources": p["sources"], "K": p.get("K"),
                 "fusion": _fusion(p),
                 "follows": p["follows"], "follows_lo": p["follows_lo"], "follows_hi": p["follows_hi"],
                 "coincidence": p["coincidence"], "coincidence_lo": p["coincidence_lo"],
                 "coincidence_hi": p["coincidence_hi"],
                 "harm": p["harm_fixed_s0"]["diff"], "harm_lo": p["harm_fixed_s0"]["lo"], "harm_hi": p["harm_fixed_s0"]["hi"],
                 "eps_vs_base": p["harm_eps"]["diff"], "eps_vs_base_lo": p["harm_eps"]["lo"],
                 "eps_vs_base_hi": p["harm_eps"]["hi"], "base_pass1": p["pass1"]["Base"]["rate"]}
                for p in res["points"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable studies/steering.py result ({type(e).__name__}: {e})") from e
    df = pd.DataFrame(rows).sort_values(["chains", "K"]).reset_index(drop=True)
    df.attrs.update({"commit": res.get("commit", "?"), "machine": res.get("machine", {}), "overrides":
                     res["points"][0].get("overrides", []) if res["points"] else []})
    if not np.isfinite(df[["follows", "coincidence", "harm"]].to_numpy(dtype=float)).all():
        raise ValueError(f"{path}: NaN or Inf among the steering results")
    return df


def scaling_provenance(df: "pd.DataFrame") -> str:
    """The sentence above the scaling figure: each stored result of :func:`scaling_frame` with its K, commit,
    machine and overrides."""
    from pathlib import Path

    def one(attrs, ks) -> str:
        at_k = f"K = {', '.join(str(int(k)) for k in sorted(ks))}: " if len(ks) else ""
        return (f"{at_k}commit `{attrs['commit']}`, {attrs['machine'].get('cpu', '?')}, "
                f"overrides {attrs['overrides'] or 'none'}")

    if "stored" not in df.attrs:
        return f"Stored result: {one(df.attrs, df.K.dropna().unique() if 'K' in df else [])}."
    return "Stored results: " + "; ".join(
        f"`{Path(s['path']).name}` ({one(s, df.K[df.stored == i].dropna().unique())})"
        for i, s in enumerate(df.attrs["stored"])) + "."


GENERATION_RESULT = "studies/results/generation_controls.json"


def generation_result_path(root=None):
    """Where the repository keeps the stored generation controls (a ``studies/steering.py`` run on the demo's
    own pretraining with epsilons 0, 0.1 and 1; None outside a checkout or when absent)."""
    return stored_result(GENERATION_RESULT, root)


def _generation_label(config: str) -> str:
    from ctrls.config.settings import BASE, FIXED

    if config == BASE:
        return "no adapter (Base)"
    if config == FIXED:
        return "the prompt's state s0 at every step (fixed s0)"
    try:
        eps = float(config.split("=", 1)[1])
    except (IndexError, ValueError):
        return config
    what = {0.0: "a prior draw", 1.0: "a uniformly random state"}.get(eps, "the policy's ε-greedy draw")
    return f"{what} ({config})"


def generation_frame(path) -> "pd.DataFrame":
    """Generation under each state condition, from the first point of a ``studies/steering.py`` result run
    with several epsilon rows: per row pass@1 and Succ. and, where states are drawn, the fraction of steps
    that follow their state and its coincidence reference, each a fraction with its 95% interval. Rows in
    the grid's order (Base, fixed s0, epsilon ascending). A missing field or NaN/Inf is a clear error."""
    from pathlib import Path

    import pandas as pd

    from ctrls.config.settings import BASE, FIXED

    def order(config: str) -> tuple:  # Base, fixed s0, then epsilon ascending (Table 1's order)
        try:
            eps = float(config.split("=", 1)[1])
        except (IndexError, ValueError):
            eps = 99.0
        return (config != BASE, config != FIXED, eps)

    path = Path(path)
    res = read_stored(path, "generation")  # checked (ctrls.report.stored)
    try:
        pt = res["points"][0]
        out = []
        for config, r in sorted(pt["rows"].items(), key=lambda kv: order(kv[0])):
            row = {"config": config, "condition": _generation_label(config), "samples": r["pass1"]["samples"],
                   "questions": r["pass1"]["questions"]}
            for key in ("pass1", "succ", "follows", "coincidence"):
                d = r.get(key)
                row.update({key: d["rate"], f"{key}_lo": d["lo"], f"{key}_hi": d["hi"]} if d else
                           {key: np.nan, f"{key}_lo": np.nan, f"{key}_hi": np.nan})
            out.append(row)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"{path}: not a readable studies/steering.py result with rows ({type(e).__name__}: {e})") from e
    df = pd.DataFrame(out)
    if df.empty or not np.isfinite(df[["pass1", "succ"]].to_numpy(dtype=float)).all() or \
            np.isinf(df[["follows", "coincidence"]].to_numpy(dtype=float)).any():
        raise ValueError(f"{path}: generation controls with no rows or a NaN/Inf rate")
    df.attrs.update({"commit": res.get("commit", "?"), "machine": res.get("machine", {}),
                     "overrides": pt.get("overrides", []), "sources": pt.get("sources"), "chains": pt.get("chains")})
    return df


def generation_view(df: "pd.DataFrame") -> "pd.DataFrame":
    """The page's table of :func:`generation_frame`: percentages with their intervals ("—" where a row
    draws no state)."""
    import pandas as pd

    from ctrls.report.provenance import pct_ci

    def cell(r, k):
        return "—" if pd.isna(r[k]) else pct_ci(r[k], r[f"{k}_lo"], r[f"{k}_hi"])

    return pd.DataFrame({"condition": df.condition, "samples": df.samples,
                         "pass@1 (%)": [cell(r, "pass1") for _, r in df.iterrows()],
                         "Succ. (%)": [cell(r, "succ") for _, r in df.iterrows()],
                         "follows its state (%)": [cell(r, "follows") for _, r in df.iterrows()],
                         "by coincidence (%)": [cell(r, "coincidence") for _, r in df.iterrows()]})


def generation_sentences(df: "pd.DataFrame") -> list[str]:
    """What :func:`generation_frame` shows, computed: how far the adapter's rows move pass@1 and Succ.
    from Base's, whatever the state they draw (style), and how often each state-drawing row's steps
    follow their state against its coincidence rate (steering)."""
    from ctrls.config.settings import BASE

    base = df[df.config == BASE]
    rows = df[df.config != BASE]
    out = []
    if len(base) and len(rows):
        b = base.iloc[0]
        out.append(f"With the adapter, pass@1 is {100 * rows.pass1.min():.1f}–{100 * rows.pass1.max():.1f}% and Succ. "
                   f"{100 * rows.succ.min():.1f}–{100 * rows.succ.max():.1f}% across the {len(rows)} state conditions, "
                   f"against Base's {100 * b.pass1:.1f}% and {100 * b.succ:.1f}%"
                   + (": every condition is above Base, whichever state it draws (the gain in pass@1 is the adapter's "
                      "style, not the state's choice)."
                      if (rows.pass1 > b.pass1).all() and (rows.succ > b.succ).all() else "."))
    drawn = rows.dropna(subset=["follows", "coincidence"])
    if len(drawn):
        out.append("Steps follow the state they were drawn for " + "; ".join(
            f"{100 * r.follows:.1f}% under {r.condition.split(' (')[0]} against {100 * r.coincidence:.1f}% by coincidence"
            for _, r in drawn.iterrows()) + ".")
    return out


HARM_GOAL = -0.05  # fixed s0's pass@1 within 5 points of Base's, or above: the K sweep's choice rule (steering_k)


# ---- how many states: the granularity that steers ------------------------------------------------

STATES_RESULT = "studies/results/steering_states.json"


def states_result_path(root=None):
    """Where the repository keeps the stored K sweep of ``studies/steering.py --n-states`` (None when absent)."""
    return stored_result(STATES_RESULT, root)


FUSION_RESULT = "studies/results/steering_fusion.json"


def fusion_result_path(root=None):
    """Where the repository keeps the stored fusion comparison (``studies/steering.py -o adapter.fusion=mlp``)."""
    return stored_result(FUSION_RESULT, root)


def fusion_frame(states_path, fusion_path) -> "pd.DataFrame":
    """The fusion comparison: the points of a ``studies/steering.py`` result run with another ``adapter.fusion``
    (``fusion_path``) beside the K sweep's points (``states_path``, :func:`scaling_frame`) at the same K and
    number of training chains, the same settings otherwise. A point of the fusion result with no such
    partner in the sweep is a clear error (it would be compared with nothing)."""
    import pandas as pd

    f, k = scaling_frame(fusion_path), scaling_frame(states_path)
    key = ["K", "chains", "sources"]
    partners = k.merge(f[key].drop_duplicates(), on=key)
    missing = f[key].merge(k[key], how="left", on=key, indicator=True).query("_merge == 'left_only'")
    if len(missing):
        raise ValueError(f"{fusion_path}: no point of the K sweep {states_path} at the same K, chains and sources "
                         f"for {missing[key].to_dict('records')}")
    out = pd.concat([partners, f]).drop_duplicates(["fusion", *key]).sort_values(["K", "fusion"]).reset_index(drop=True)
    out.attrs.update(f.attrs)
    return out


FUSION_LABELS = {"linear": "linear (Eq. 8 as written)", "mlp": "MLP (ours: the state's effect depends on the token)"}


def chance_corrected(follows, coincidence):
    """kappa = (follows - coincidence) / (1 - coincidence): the share of the steps that coincidence leaves
    to be steered that do land in their drawn state (Cohen's kappa). 0 is chance, 1 every step; unlike
    the ratio follows / coincidence it does not favour many states (a ratio of 3 needs 75% follows at
    K = 4, where coincidence is near 25%, but 24% at K = 16)."""
    from ctrls.stats.agreement import kappa  # the one kappa: NaN where coincidence is 1 (nothing to steer)

    f, c = np.broadcast_arrays(np.asarray(follows, dtype=float), np.asarray(coincidence, dtype=float))
    out = np.array([kappa(a, b) for a, b in zip(f.ravel(), c.ravel())], dtype=float).reshape(f.shape)
    return out if out.ndim else float(out)


def steering_k(df: "pd.DataFrame") -> "pd.Series":
    """The row of a K sweep (:func:`scaling_frame`) that steers most: the largest kappa
    (:func:`chance_corrected`, in the returned row as ``kappa``) among the Ks whose fixed-s0 row meets
    ``HARM_GOAL``, or among all when none does. The one rule of the pretraining page and finding 3."""
    d = df.assign(kappa=chance_corrected(df.follows, df.coincidence))
    ok = d[d.harm >= HARM_GOAL]
    return (ok if len(ok) else d).loc[lambda x: x.kappa.idxmax()]


def states_view(df: "pd.DataFrame") -> "pd.DataFrame":
    """The page's table of a K sweep (:func:`scaling_frame` of a ``steering_states`` result): per K the
    epsilon row's follows rate and its coincidence reference (95% intervals), their ratio and kappa
    (:func:`chance_corrected`), and pass@1 of the fixed-s0 and epsilon rows minus Base's."""
    import pandas as pd

    from ctrls.report.provenance import column_decimals, pct_ci

    def pts(v, lo, hi):
        return f"{100 * v:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]".replace("-", "−")

    d = df.sort_values("K")
    # one rounding per column
    fd, cd = column_decimals(d.follows_lo, d.follows_hi), column_decimals(d.coincidence_lo, d.coincidence_hi)
    return pd.DataFrame({"K": d.K.astype(int), "F_u": d["fusion"], "training chains": d.chains,
                         "ε row follows its state (%)": [pct_ci(r.follows, r.follows_lo, r.follows_hi, fd)
                                                         for _, r in d.iterrows()],
                         "by coincidence (%)": [pct_ci(r.coincidence, r.coincidence_lo, r.coincidence_hi, cd)
                                                for _, r in d.iterrows()],
                         "ratio": [f"{r.follows / r.coincidence:.1f}×" if r.coincidence > 0 else "—" for _, r in d.iterrows()],
                         "κ": [f"{k:.2f}".replace("-", "−") for k in chance_corrected(d.follows, d.coincidence)],
                         "fixed s0 − Base (pass@1, points)": [pts(r.harm, r.harm_lo, r.harm_hi) for _, r in d.iterrows()],
                         "ε − Base (points)": [pts(r.eps_vs_base, r.eps_vs_base_lo, r.eps_vs_base_hi) for _, r in d.iterrows()]})


CONCENTRATION_RESULT = "studies/results/concentration.json"


def concentration_result_path(root=None):
    """Where the repository keeps the stored ``studies/concentration.py`` result (None when absent)."""
    return stored_result(CONCENTRATION_RESULT, root)


def concentration_frame(path) -> "pd.DataFrame":
    """The points of a ``studies/concentration.py`` result: one row per (Dirichlet concentration c, CTRLS
    row) with the follows-its-state rate, its coincidence reference (Base steps against chains drawn from
    the same policy), each with its 95% interval, the row's pass@1 and Base's, and n. The fitted c is in
    ``attrs``. A missing field or a non-finite rate is a clear error."""
    from pathlib import Path

    import pandas as pd

    path = Path(path)
    res = read_stored(path, "concentration")  # checked (ctrls.report.stored)
    try:
        rows = [{"c": p["c"], "row": row, "steps": v["steps"], "follows": v["follows"], "follows_lo": v["follows lo"],
                 "follows_hi": v["follows hi"], "coincidence": v["Base, random states"],
                 "coincidence_lo": v["Base, random states lo"], "coincidence_hi": v["Base, random states hi"],
                 "pass@1": p["pass@1"][row], "Base pass@1": p["pass@1"]["Base"], "samples": p["samples"][row]}
                for p in res["points"] for row, v in p["controllability"].items()]
        fitted = float(res["fitted_c"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable studies/concentration.py result ({type(e).__name__}: {e})") from e
    df = pd.DataFrame(rows).sort_values(["row", "c"]).reset_index(drop=True)
    if df.empty or not np.isfinite(df[["c", "follows", "coincidence", "pass@1"]].to_numpy(dtype=float)).all():
        raise ValueError(f"{path}: a studies/concentration.py result with no points or a NaN/Inf rate")
    df.attrs.update({"fitted_c": fitted, "machine": res.get("machine", {}), "commit": res.get("commit", "?")})
    return df


INJECTION_RESULT = "studies/results/injection.json"  # at K = 16 (the demo's K before the K sweep)
INJECTION_RESULTS = (INJECTION_RESULT, "studies/results/injection_k4.json")  # ... and at K = 4


def injection_result_paths(root=None) -> list:
    """Every stored ``studies/injection.py`` result of ``INJECTION_RESULTS`` that the repository holds."""
    return stored_results(INJECTION_RESULTS, root)


def _injection_label(layer: str, n_layers: int | None) -> str:
    if layer == "last":
        return "last hidden state (the stages' adapter)"
    if layer == "0":
        return "input embeddings (Alg. 1)"
    return f"output of layer {layer}" + (f" of {n_layers}" if n_layers else "")


def injection_frame(path) -> "pd.DataFrame":
    """The rows of a ``studies/injection.py`` result: one per injection point, with the held-out controls
    (log P per token over the backbone alone under the posterior state, shuffled states, a random state)
    and generation (follows-its-state with its coincidence reference, each with its 95% interval; pass@1 and
    Succ. beside Base's). A missing field or a non-finite number is a clear error."""
    from pathlib import Path

    import pandas as pd

    path = Path(path)
    res = read_stored(path, "injection")  # checked (ctrls.report.stored)
    try:
        base = res["base"]
        rows = []
        for layer, r in res["rows"].items():
            g, st = r["controls"]["gain_over_backbone"], r["steering"]
            f, c = st["follows"], st["coincidence"]
            rows.append({"injection": _injection_label(layer, res.get("n_layers")),
                         "epochs kept": r["fit"].get("kept_epoch"), "Adam steps": r["fit"].get("optimizer_steps"),
                         "posterior": g["posterior"], "shuffled": g["shuffled states"], "random": g["random state"],
                         "follows": f["rate"], "follows_lo": f["lo"], "follows_hi": f["hi"], "steps": f["steps"],
                         "coincidence": c["rate"], "coincidence_lo": c["lo"], "coincidence_hi": c["hi"],
                         "pass@1": st["pass1"], "Succ.": st["succ"], "Base pass@1": base["pass1"],
                         "Base Succ.": base["succ"], "samples": st["samples"]})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a readable studies/injection.py result ({type(e).__name__}: {e})") from e
    df = pd.DataFrame(rows)
    num = ["posterior", "shuffled", "random", "follows", "coincidence", "pass@1", "Succ."]
    if df.empty or not np.isfinite(df[num].to_numpy(dtype=float)).all():
        raise ValueError(f"{path}: a studies/injection.py result with no rows or a NaN/Inf number")
    df.attrs.update({"machine": res.get("machine", {}), "commit": res.get("commit", "?"), "K": res.get("n_states"),
                     "questions": res.get("questions"), "samples_per_question": res.get("samples_per_question"),
                     "epsilon": res.get("epsilon"), "train_chains": res.get("train_chains")})
    return df
