"""Does the state steer the step? The stored test-seed results, read for the pretraining page and finding 3.

- ``seeds_frame``: the demo's mechanism numbers on the validation data seeds (``studies/seeds.py``): kappa against the
  independent-chain null, the fixed-s0 harm as non-inferiority, epsilon - Base pass@n; a pooled row;
- ``state_prompt_frame``: the state prompt against the last-hidden adapter on the same test questions
  (``studies/state_prompt.py``), a paired test per seed, Holm over the seeds;
- ``null_steps``: each epsilon step beside an independent chain's state at that step (the null of the
  controllability table);
- ``stage_option_frame`` / ``stage_option_sentence``: the state prompt as the stages run it
  (``state_prompt.use=true``, ``studies/seeds.py`` on those runs), against the steering criterion;
- ``position_mask_frame`` / ``position_mask_view``: the same runs' exploration with the position mask
  (``grid.position_floor``, ``ctrls.method.positions``): the states that mark a position are drawn only where
  they can occur, and the fixed-s0 row holds s0 only there;
- ``with_adapter_frame`` / ``with_adapter_view``: the masked runs again with the frozen adapter applied as
  well (``state_prompt.with_adapter``), against the state prompt alone on the same questions (``--against``);
- ``steering_table``: finding 3's table of kappa on the data seeds other than the development one, by role;
- ``defaults_frame``: runs made with a profile's defaults, refused unless their recorded settings are that
  profile's today;
- ``TEXT_CUE_BOUND``: the ceiling the backbone allows, measured by forcing text cues.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

# the readers of one stored result's fields (steered_rl and scaled import them from here)
from ctrls.report.stored import (
    checked_count,
    checked_flag,
    checked_interval,
    checked_kappa,
    checked_number,
    checked_seeds,
    position_floor,
    reading,
    stored_setting,
)
from ctrls.report.stored import read as read_stored
from ctrls.report.words import say
from ctrls.stats.agreement import base_chain, null_steps  # noqa: F401  (read by the pages)
from ctrls.stats.metrics import format_p, holm

REPO = Path(__file__).resolve().parents[2]
SEEDS_RESULT = "studies/results/seeds.json"
STATE_PROMPT_RESULTS = "studies/results/state_prompt_seed*.json"
STAGE_OPTION_RESULT = "studies/results/state_prompt_stage.json"  # studies/seeds.py on runs with state_prompt.use=true
POSITION_MASK_RESULT = "studies/results/state_prompt_positions.json"  # the same, exploration rerun with grid.position_floor > 0
# the demo's defaults (the state prompt, masked) on data seed 10
DEFAULT_RESULT = "studies/results/state_prompt_default_seed10.json"
ADAPTER_RESULT = "studies/results/state_prompt_adapter.json"  # the masked runs with state_prompt.with_adapter, --against them
# the criterion for a seed other than the development one, fixed before the runs: kappa >= 0.5 with its 95% lower bound
# above 0.3, the fixed-s0 row non-inferior to Base (its interval's lower bound above -5 points)
KAPPA_BAR, KAPPA_LO_BAR = 0.5, 0.3


def steers(kappa: float, lo: float) -> bool:
    """The steering criterion above: kappa at least KAPPA_BAR with its 95% lower bound above KAPPA_LO_BAR."""
    return kappa >= KAPPA_BAR and lo > KAPPA_LO_BAR


# each data seed's role, by what saw it (the design notes' table); the seeds study's 100-107 are test seeds too
SEED_ROLES = {0: "development", 1: "validation", 2: "validation", 3: "validation", 5: "validation",
              6: "confirmation", 7: "confirmation", 8: "confirmation", 9: "confirmation", 10: "test"}
# A text cue forced at a step's start ("a ± b =", "The answer is", "To solve this problem,") lands in its
# target state 95-97% of the time (37 contexts each, the demo's backbone and read-back, untrained): what
# an input-side state could reach on this backbone. Measured outside this repository (a probe on seed 0's questions).
TEXT_CUE_BOUND = (0.95, 0.97)


def seed_role(seed: int) -> str | None:
    """A data seed's role (:data:`SEED_ROLES`; 100-107 are the seeds study's test seeds), None when it has none."""
    return SEED_ROLES.get(int(seed)) or ("test" if 100 <= int(seed) <= 107 else None)


def seed_words(seeds) -> str:
    """Data seeds with their role, as a reader writes them: "validation data seeds 1, 2 and 3", "confirmation
    data seed 6", "data seeds 5 (validation) and 6 (confirmation)"."""
    from ctrls.report.display import and_list

    seeds = [int(s) for s in seeds]
    roles = {seed_role(s) for s in seeds}
    many = "s" if len(seeds) != 1 else ""
    if len(roles) == 1:
        role = roles.pop()
        return f"{role + ' ' if role else ''}data seed{many} {and_list(seeds)}"
    return f"data seed{many} " + and_list(f"{s} ({seed_role(s)})" if seed_role(s) else str(s) for s in seeds)


def results_dir() -> Path:
    """Where stored study results are read: $CTRLS_RESULTS_DIR (laid out like the repository), else the repository."""
    return Path(os.environ.get("CTRLS_RESULTS_DIR", REPO))


def read_seeds_result(path, kind: str = "seeds", **claims) -> dict:
    """A ``studies/seeds.py`` (or, with ``kind="state_prompt"``, ``studies/state_prompt.py``) result read by its one
    validating reader (``ctrls.report.stored.read``), with the settings, profile and seed fields its page claims."""
    return read_stored(path, kind, **claims)


SEED_FIELDS = ("questions", "kappa", "harm_fixed_minus_base_pass1", "eps_minus_base_pass_n")  # what seeds_frame shows


def seeds_frame(path: str | Path | None = None) -> pd.DataFrame:
    """One row per data seed (its role: :data:`SEED_ROLES`), a pooled row, and the development seed's row beside (every choice was
    made on it: outside the pool and Holm): kappa [95%] against the independent-chain null with its n,
    the fixed-s0 harm (pass@1 minus Base's) [95%] and whether it is non-inferior at the stored margin,
    and epsilon - Base pass@n [Table 1's family interval]."""
    path = Path(path) if path else results_dir() / SEEDS_RESULT
    d = read_seeds_result(path, seed_fields=SEED_FIELDS)
    with reading(path):
        margin = checked_number(d, "margin_points", path, 0, 100)
        rows = [_seed_row(s, path, margin) for s in checked_seeds(d.get("seeds") or [], path)]
        if not rows:
            raise ValueError(f"{path}: no seeds")
        t = pd.DataFrame(rows)
        t["p (Holm)"] = holm(t["p"])
        pooled = {"data seed": "pooled", "questions": int(t.questions.sum()), **checked_kappa(d["pooled_kappa"], path)}
        # development: beside, outside Holm and the pool
        dev = [{**_seed_row(s, path, margin), "data seed": f"{int(s['data_seed'])} (development)"}
               for s in checked_seeds(d.get("development") or [], path, "development")]
    t = pd.concat([t, pd.DataFrame([pooled]), pd.DataFrame(dev)], ignore_index=True)
    t.attrs.update(commit=d.get("commit", "?"), margin=margin, source=str(path), profile=stored_profile(d, path))
    return t


def stored_profile(d: dict, path) -> str:
    """The profile a stored result's runs were made with ("?" where not stored), refused when it is not a name."""
    v = d.get("profile", "?")
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{path}: field 'profile' must be a profile's name, got {v!r}")
    return v


def _seed_row(s: dict, path, margin: float) -> dict:
    """One seed of a stored seeds result, validated; its non-inferiority verdict must follow its interval
    (lower bound above -margin points)."""
    h, e = s["harm_fixed_minus_base_pass1"], s["eps_minus_base_pass_n"]
    hd, hlo, hhi = checked_interval(h, "diff", "lo", "hi", path)
    ni = checked_flag(h, "non_inferior", path)
    if ni != (hlo > -margin / 100):
        raise ValueError(f"{path}: field 'non_inferior' of data seed {s.get('data_seed')!r} is {str(ni).lower()}, but the "
                         f"harm's lower bound {100 * hlo:+.1f} points is {'not ' if ni else ''}above −{margin:g}")
    return {"data seed": checked_count(s, "data_seed", path, 0), "questions": checked_count(s, "questions", path),
            **checked_kappa(s["kappa"], path), "harm": hd, "harm lo": hlo, "harm hi": hhi, "non-inferior": ni,
            **dict(zip(("ε − Base pass@n", "ε − Base lo", "ε − Base hi"), checked_interval(e, "diff", "lo", "hi", path))),
            **_answer_rates(s, path), **_eps_minus_fixed(s, path)}


def _eps_minus_fixed(s: dict, path) -> dict:
    """epsilon - fixed-s0 pass@1 [95%] (the exploration claim with the injection held), NaN where not stored."""
    e = s.get("eps_minus_fixed_pass1")
    if not isinstance(e, dict):
        return {"ε − fixed": math.nan, "ε − fixed lo": math.nan, "ε − fixed hi": math.nan}
    d, lo, hi = checked_interval(e, "diff", "lo", "hi", path)
    return {"ε − fixed": d, "ε − fixed lo": lo, "ε − fixed hi": hi}


def _answer_rates(s: dict, path) -> dict:
    """The Base and fixed-s0 rows' answer rates and the fixed-s0 chains that ran all T steps unanswered,
    where the stored seed has them (``studies/seeds.py`` since the stage option's second seed), else NaN."""
    v, a = s.get("valid"), s.get("ran_all_steps")
    if not isinstance(v, dict) or not isinstance(a, dict):
        return {"Base answers": math.nan, "fixed answers": math.nan, "fixed ran all steps": math.nan, "T": math.nan}
    return {"Base answers": checked_number(v, "Base", path, 0, 1), "fixed answers": checked_number(v, "fixed s0", path, 0, 1),
            "fixed ran all steps": checked_number(a, "fixed s0", path, 0, 1), "T": checked_count(s, "max_steps", path)}


def ci_text(v, lo, hi, fmt: str = "{:.2f}") -> str:
    """An estimate with its 95% interval, negative numbers with the book's minus sign."""
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]".replace("-", "−")


def seeds_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`seeds_frame` for the page: rates and kappa with their intervals and n."""
    def iv(v, lo, hi, scale=1.0, digits=2, sign=False):
        if pd.isna(v):
            return "—"
        f = f"{{:{'+' if sign else ''}.{digits}f}}"
        return ci_text(scale * v, scale * lo, scale * hi, f)

    return pd.DataFrame({
        "data seed": t["data seed"], "questions": t.questions, "steps": t.steps,
        "follows (%)": (100 * t.follows).round(1), "independent-chain null (%)": (100 * t["null"]).round(1),
        "κ [95%]": [iv(*r) for r in zip(t.kappa, t["kappa lo"], t["kappa hi"])],
        "p (Holm over seeds)": [("—" if pd.isna(p) else format_p(p)) for p in t.get("p (Holm)", [math.nan] * len(t))],
        "fixed s0 − Base pass@1 (pts)": [iv(*r, scale=100, digits=1, sign=True) for r in zip(t.harm, t["harm lo"], t["harm hi"])],
        f"non-inferior ({t.attrs.get('margin', 5):g} pts)": [("—" if pd.isna(x) else ("yes" if x else "no"))
                                                              for x in t["non-inferior"]],
        "ε − Base pass@n (pts)": [iv(*r, scale=100, digits=1, sign=True)
                                  for r in zip(t["ε − Base pass@n"], t["ε − Base lo"], t["ε − Base hi"])],
        "ε − fixed s0 pass@1 (pts)": [iv(*r, scale=100, digits=1, sign=True) for r in
                                      zip(*(t.get(k, pd.Series([math.nan] * len(t)))
                                            for k in ("ε − fixed", "ε − fixed lo", "ε − fixed hi")))]})


def state_prompt_frame(paths: list[str | Path] | None = None, seeds: str | Path | None = None) -> pd.DataFrame:
    """One row per stored state-prompt run: kappa of the state prompt and of the adapter on the same test
    questions, their paired difference [95%] with its p (Holm over the runs), pass@1 of both and of Base
    on the same seed (from ``seeds``, the stored seeds result), and kappa by step (1, 2, 3+)."""
    paths = [Path(p) for p in paths] if paths else sorted(results_dir().glob(STATE_PROMPT_RESULTS))
    if not paths:
        raise FileNotFoundError(f"no stored state-prompt result ({STATE_PROMPT_RESULTS})")
    rows, seen = [], {}
    for path in paths:
        d = read_seeds_result(path, "state_prompt")
        with reading(path):
            rows.append(_state_prompt_row(d, path))
        seed = rows[-1]["data seed"]
        if seed in seen:  # one seed's run counted twice in Holm
            raise ValueError(f"{path}: field 'data_seed': data seed {seed} is stored in {seen[seed]} too")
        seen[seed] = path
    t = pd.DataFrame(rows).sort_values("data seed").reset_index(drop=True)
    t["p (Holm)"] = holm(t["p"])
    t["Base pass@1"] = t["data seed"].map(_base_pass1(seeds))  # the same seed's questions and samples (seeds.json)
    return t


def _state_prompt_row(d: dict, path) -> dict:
    """One stored state-prompt run of :func:`state_prompt_frame`, validated."""
    sp, ad, c = checked_kappa(d["state_prompt"], path), checked_kappa(d["adapter"], path), d["state_prompt_minus_adapter"]
    diff, lo, hi = checked_interval(c, "diff", "lo", "hi", path, (-2, 2))
    by = {f"κ {k}": checked_number(v, "kappa", path, -1, 1) for k, v in d["state_prompt"].get("by_step", {}).items()}
    return {"data seed": checked_count(d, "data_seed", path, 0), "questions": sp["questions"],
            "vectors per state": checked_count(d, "vectors_per_state", path),
            "state prompt κ": sp["kappa"], "sp lo": sp["kappa lo"], "sp hi": sp["kappa hi"], "sp steps": sp["steps"],
            "adapter κ": ad["kappa"], "ad lo": ad["kappa lo"], "ad hi": ad["kappa hi"], "ad steps": ad["steps"],
            "Δκ": diff, "Δκ lo": lo, "Δκ hi": hi, "p": checked_number(c, "p_value", path, 0, 1),
            "state prompt pass@1": checked_number(d["state_prompt"], "pass1", path, 0, 1),
            "adapter pass@1": checked_number(d["adapter"], "pass1", path, 0, 1), **by,
            "commit": d.get("commit", "?"), "source": str(path)}


def _base_pass1(path: Path | None) -> dict:
    """Base's pass@1 per data seed from the stored seeds result ({} when it is not stored)."""
    path = path or results_dir() / SEEDS_RESULT
    if not Path(path).is_file():
        return {}
    d = read_seeds_result(Path(path))
    with reading(path):
        return {checked_count(s, "data_seed", path, 0): checked_number(s.get("pass1", {}), "Base", path, 0, 1)
                for s in checked_seeds(d.get("seeds") or [], path) if "Base" in s.get("pass1", {})}


def _pc(x: float) -> str:
    return format(100 * x, ".1f") + "%"


def steering_sentences(seeds: pd.DataFrame | None = None, prompt: pd.DataFrame | None = None) -> list[str]:
    """Short sentences for the first page and the pretraining page, each with its number, 95% interval
    and n, from :func:`seeds_frame` and :func:`state_prompt_frame` (either may be None: not stored); the words
    are ``book/_templates/mechanism.md``'s."""
    out = []
    if seeds is not None:
        fresh = seeds["data seed"].map(lambda x: isinstance(x, (int, np.integer)))
        per, dev = seeds[fresh], seeds[~fresh & (seeds["data seed"] != "pooled")]
        pooled = seeds[seeds["data seed"] == "pooled"].iloc[0]
        out.append(say("mechanism", "pooled", seeds=seed_words(per["data seed"]), questions=int(pooled.questions),
                       steps=int(pooled.steps), follows=_pc(pooled.follows), null=_pc(pooled["null"]),
                       kappa=ci_text(pooled.kappa, pooled["kappa lo"], pooled["kappa hi"])))
        out.append(say("mechanism", "per seed", held=int((per["kappa lo"] > 0).sum()), n=len(per),
                       kappas=", ".join(ci_text(r.kappa, r["kappa lo"], r["kappa hi"]) for _, r in per.iterrows())))
        out.append(say("mechanism", "harm", margin=format(seeds.attrs.get("margin", 5), "g"),
                       ni=int(per["non-inferior"].sum()), n=len(per)))
        for _, r in dev.iterrows():
            out.append(say("mechanism", "development", seed=r["data seed"], steps=int(r.steps),
                           kappa=ci_text(r.kappa, r["kappa lo"], r["kappa hi"])))
    if prompt is not None and len(prompt):
        for _, r in prompt.iterrows():
            out.append(say("mechanism", "prompt", seed=r["data seed"], vectors=r["vectors per state"],
                           sp=ci_text(r["state prompt κ"], r["sp lo"], r["sp hi"]), steps=int(r["sp steps"]),
                           ad=ci_text(r["adapter κ"], r["ad lo"], r["ad hi"]), questions=int(r.questions),
                           delta=ci_text(r["Δκ"], r["Δκ lo"], r["Δκ hi"], "{:+.2f}"), p=format_p(r["p (Holm)"])))
    lo, hi = TEXT_CUE_BOUND
    out.append(say("mechanism", "ceiling", lo=format(100 * lo, ".0f"), hi=format(100 * hi, ".0f")))
    return out


def stage_option_frame(path: str | Path | None = None) -> pd.DataFrame:
    """:func:`seeds_frame` of the stored result of runs made with ``state_prompt.use=true`` (the stages'
    own fit and decode, run by the README's commands); refused when its overrides do not hold the option."""
    path = Path(path) if path else results_dir() / STAGE_OPTION_RESULT
    read_seeds_result(path, settings={"state_prompt.use": "true"})
    t = seeds_frame(path)
    if t["data seed"].map(lambda x: isinstance(x, (int, np.integer))).sum() == 1:  # one seed: its pooled row repeats it
        attrs, t = t.attrs, t[t["data seed"] != "pooled"].reset_index(drop=True)
        t.attrs.update(attrs)
    return t


def stage_option_sentence(t: pd.DataFrame, lead: str = "With `state_prompt.use=true`") -> str:
    """:func:`stage_option_frame` in sentences: per data seed, the epsilon row's kappa [95%] with its n and the
    fixed-s0 harm [95%], each held against the steering criterion (kappa >= 0.5 with its lower bound above 0.3;
    the harm non-inferior at the stored margin), and by how much a missed part misses."""
    per = t[t["data seed"].map(lambda x: isinstance(x, (int, np.integer)))]
    margin = t.attrs.get("margin", 5)
    out = []
    for _, r in per.iterrows():
        miss = []
        if r.kappa < KAPPA_BAR:
            miss.append(say("mechanism", "option.kappa short", by=format(KAPPA_BAR - r.kappa, ".3f"), value=KAPPA_BAR))
        if r["kappa lo"] <= KAPPA_LO_BAR:
            miss.append(say("mechanism", "option.lower short", by=format(KAPPA_LO_BAR - r["kappa lo"], ".3f"),
                            value=KAPPA_LO_BAR))
        within = not r["non-inferior"] and r.harm > -margin / 100
        out.append(say("mechanism", "option", lead=lead, seeds=seed_words([r["data seed"]]), questions=int(r.questions),
                       steps=int(r.steps), follows=_pc(r.follows), null=_pc(r["null"]),
                       kappa=ci_text(r.kappa, r["kappa lo"], r["kappa hi"]),
                       criterion="; ".join(miss) if miss else say("mechanism", "option.meets"),
                       harm=ci_text(100 * r.harm, 100 * r["harm lo"], 100 * r["harm hi"], "{:+.1f}"),
                       inferior=say("mechanism", "option.non-inferior" if r["non-inferior"] else "option.not non-inferior"),
                       margin=format(margin, "g"),
                       within=say("mechanism", "option.within", margin=format(margin, "g")) if within else ""))
        if r.harm <= -margin / 100 and not pd.isna(r.get("fixed answers", math.nan)):
            out.append(say("mechanism", "option.answers", seed=int(r["data seed"]), fixed=_pc(r["fixed answers"]),
                           base=_pc(r["Base answers"]), all=_pc(r["fixed ran all steps"]), T=int(r["T"]),
                           why=say("mechanism", "option.answers.floor" if "floor" in t.attrs else "option.answers.all")))
    got = per.dropna(subset=["ε − fixed"]) if "ε − fixed" in per else per.iloc[:0]
    if len(got):  # the exploration claim with the injection held: drawn transitions against the row held at s0
        diffs = ", ".join(say("mechanism", "option.transition", seed=int(r["data seed"]),
                              diff=ci_text(100 * r["ε − fixed"], 100 * r["ε − fixed lo"], 100 * r["ε − fixed hi"], "{:+.1f}"))
                          for _, r in got.iterrows())
        out.append(say("mechanism", "option.transitions", diffs=diffs, won=int((got["ε − fixed lo"] > 0).sum()),
                       lost=int((got["ε − fixed hi"] < 0).sum()), n=len(got)))
    pool = t[t["data seed"] == "pooled"]
    if len(per) > 1 and len(pool):  # questions of different seeds are different clusters of the bootstrap
        r = pool.iloc[0]
        meets = r.kappa >= KAPPA_BAR and r["kappa lo"] > KAPPA_LO_BAR
        out.append(say("mechanism", "option.pooled", n=len(per), questions=int(r.questions), steps=int(r.steps),
                       follows=_pc(r.follows), null=_pc(r["null"]), kappa=ci_text(r.kappa, r["kappa lo"], r["kappa hi"]),
                       criterion=say("mechanism", "option.pooled.meets" if meets else "option.pooled.short")))
    return " ".join(out)


def _variant_text(d: dict) -> str:
    """What a refusal names of a stored result's variant: its recorded ``settings``, else its ``overrides``."""
    return f"settings {d['settings']}" if isinstance(d.get("settings"), dict) else f"overrides {d.get('overrides')}"


def position_mask_frame(path: str | Path | None = None) -> pd.DataFrame:
    """:func:`stage_option_frame` of the stored runs explored with the position mask; refused unless their
    overrides set ``grid.position_floor`` above 0 (``attrs["floor"]``) and every seed stores its mask."""
    path = Path(path) if path else results_dir() / POSITION_MASK_RESULT
    d = read_seeds_result(path, settings={"grid.position_floor": position_floor}, seed_fields=("position_masks",))
    try:
        floor = float(stored_setting(d, "grid.position_floor") or 0)
    except ValueError:
        floor = math.nan
    if not 0 < floor <= 1:
        raise ValueError(f"{path}: not runs with grid.position_floor in (0, 1] ({_variant_text(d)})")
    if not all(isinstance(s.get("position_masks"), dict) and s["position_masks"] for s in d.get("seeds") or []):
        raise ValueError(f"{path}: a seed without its stored position mask (studies/seeds.py stores it)")
    masks = {}  # data seed -> {pair: (counts, allowed)}, checked here so that the view needs no second read
    for s in checked_seeds(d.get("seeds") or [], path):
        for pair, m in s["position_masks"].items():
            try:
                counts, allowed = np.asarray(m["counts"], dtype=int), np.asarray(m["allowed"], dtype=bool)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: seed {s.get('data_seed')}'s mask for {pair} is malformed ({e})") from None
            if counts.shape != allowed.shape or counts.ndim != 2 or (counts < 0).any():
                raise ValueError(f"{path}: seed {s.get('data_seed')}'s mask for {pair} is malformed")
            if not allowed.any(axis=1).all():  # a draw restricted to no state
                raise ValueError(f"{path}: seed {s.get('data_seed')}'s mask for {pair} (field 'allowed') allows no state at "
                                 f"position bucket(s) {np.flatnonzero(~allowed.any(axis=1)).tolist()}")
            masks.setdefault(int(s["data_seed"]), {})[pair] = (counts.tolist(), allowed.tolist())  # lists: attrs are compared
    t = stage_option_frame(path)
    t.attrs.update(floor=floor, masks=masks)
    return t


DEFAULT_KEYS = ("state_prompt.use", "state_prompt.with_adapter", "grid.position_floor")  # the settings a result records


def defaults_frame(path: str | Path | None = None) -> pd.DataFrame:
    """:func:`position_mask_frame` of runs made with a profile's defaults (the page says so): refused unless the
    result has no overrides and records each of ``DEFAULT_KEYS`` at the value its profile has today."""
    from ctrls.config.schema import ConfigError, load_config

    path = Path(path) if path else results_dir() / DEFAULT_RESULT
    d = read_seeds_result(path)
    name = stored_profile(d, path)
    try:
        cfg = load_config("demo" if name == "?" else name)
    except ConfigError as e:
        raise ValueError(f"{path}: field 'profile': {name!r} is no profile the repository has ({e})") from None
    if d.get("overrides"):
        raise ValueError(f"{path}: not runs made with the {cfg.profile} profile's defaults: overrides {d['overrides']}")
    for key in DEFAULT_KEYS:
        section, name = key.split(".")
        want = getattr(getattr(cfg, section), name)
        if stored_setting(d, key) != (str(want).lower() if isinstance(want, bool) else str(want)):
            raise ValueError(f"{path}: not runs made with the {cfg.profile} profile's defaults: {key} is "
                             f"{stored_setting(d, key)} there, {want} in the profile ({_variant_text(d)})")
    return position_mask_frame(path)


def position_mask_view(t: pd.DataFrame) -> pd.DataFrame:
    """The masks :func:`position_mask_frame` read: per seed and step position, the training chains' steps in
    each state, marked ✓ where the state can occur there (at least ``floor`` of the position's steps, or the
    position's most frequent)."""
    rows = []
    for seed, pairs in t.attrs["masks"].items():
        for counts, allowed in pairs.values():
            counts, allowed = np.asarray(counts, dtype=int), np.asarray(allowed, dtype=bool)
            B = len(counts)
            for b in range(B):
                at = f"step {b + 1}" + ("+" if b == B - 1 else "")
                rows.append({"data seed": seed, "position": at, "training steps": int(counts[b].sum()),
                             **{f"state {k}": f"{counts[b, k]}{' ✓' if allowed[b, k] else ''}" for k in range(counts.shape[1])}})
    return pd.DataFrame(rows)


def with_adapter_frame(path: str | Path | None = None) -> pd.DataFrame:
    """One row per seed: the state prompt with the frozen last-hidden adapter as well
    (``state_prompt.with_adapter=true``) against the state prompt alone on the same test questions
    (``studies/seeds.py --against``): each variant's kappa [95%] and epsilon-row pass@1, and their paired
    differences [95%] with Holm p over the seeds. Refused unless the stored runs and the ones they are
    compared with differ in that option alone."""
    path = Path(path) if path else results_dir() / ADAPTER_RESULT
    d = read_seeds_result(path, settings={"state_prompt.with_adapter": "true", "against.state_prompt.use": "true",
                                          "against.state_prompt.with_adapter": _not_true})
    other = d.get("against")
    if str(stored_setting(d, "state_prompt.with_adapter")).lower() != "true" or not isinstance(other, dict):
        raise ValueError(f"{path}: not runs with state_prompt.with_adapter=true compared --against others "
                         f"({_variant_text(d)})")
    if (str(stored_setting(other, "state_prompt.with_adapter")).lower() == "true"
            or str(stored_setting(other, "state_prompt.use")).lower() != "true"):
        raise ValueError(f"{path}: the runs compared against must use the state prompt without the adapter "
                         f"({_variant_text(other)})")
    keys = {str(o).split("=", 1)[0].strip() for r in (d, other) for o in r.get("overrides") or []}
    keys |= {k for r in (d, other) if isinstance(r.get("settings"), dict) for k in r["settings"]}
    for key in sorted(keys - {"state_prompt.with_adapter", "data.seed", "run_dir"}):
        if stored_setting(d, key) != stored_setting(other, key):
            raise ValueError(f"{path}: the runs compared differ in {key} as well ({stored_setting(d, key)} against "
                             f"{stored_setting(other, key)}), not in state_prompt.with_adapter alone")
    if other.get("profile", d.get("profile")) != d.get("profile"):
        raise ValueError(f"{path}: the runs compared were made with another profile ({other.get('profile')!r} against "
                         f"{d.get('profile')!r})")
    with reading(path):
        t = _with_adapter_rows(d, other, path)
    t.attrs.update(commit=d.get("commit", "?"), source=str(path), profile=stored_profile(d, path))
    return t


def _not_true(v: str | None) -> bool:
    """state_prompt.with_adapter false or unset"""
    return str(v).lower() != "true"


def _with_adapter_rows(d: dict, other: dict, path) -> pd.DataFrame:
    """The rows of :func:`with_adapter_frame`, validated."""
    mine = {int(s["data_seed"]): s for s in checked_seeds(d.get("seeds") or [], path)}
    rows = []
    for a in checked_seeds(other.get("seeds") or [], path, "against.seeds"):
        s = mine.get(int(a["data_seed"]))
        if s is None:
            raise ValueError(f"{path}: seed {a['data_seed']} is compared but not stored")
        eps = [k for k in s["pass1"] if k.startswith("eps=")]
        k1, k0 = checked_kappa(s["kappa"], path), checked_kappa(a["kappa_other"], path)
        dk, dp = a["kappa_diff"], a["eps_pass1_diff"]
        rows.append({"data seed": int(a["data_seed"]), "questions": k1["questions"],
                     "steps": k1["steps"], "steps alone": k0["steps"],
                     "κ": k1["kappa"], "κ lo": k1["kappa lo"], "κ hi": k1["kappa hi"],
                     "κ alone": k0["kappa"], "κ alone lo": k0["kappa lo"], "κ alone hi": k0["kappa hi"],
                     **dict(zip(("Δκ", "Δκ lo", "Δκ hi"), checked_interval(dk, "diff", "lo", "hi", path, (-2, 2)))),
                     "Δκ p (Holm)": checked_number(dk, "p_holm", path, 0, 1),
                     "ε pass@1": checked_number(s["pass1"], eps[0], path, 0, 1) if len(eps) == 1 else math.nan,
                     "ε pass@1 alone": checked_number(a["pass1_other"], eps[0], path, 0, 1) if len(eps) == 1 else math.nan,
                     **dict(zip(("Δ pass@1", "Δ pass@1 lo", "Δ pass@1 hi"), checked_interval(dp, "diff", "lo", "hi", path))),
                     "Δ pass@1 p (Holm)": checked_number(dp, "p_holm", path, 0, 1)})
    if not rows:
        raise ValueError(f"{path}: no seeds compared")
    return pd.DataFrame(rows).sort_values("data seed").reset_index(drop=True)


def with_adapter_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`with_adapter_frame` for the page: intervals, n and Holm p."""
    pts = lambda v, lo, hi: ci_text(100 * v, 100 * lo, 100 * hi, "{:+.1f}")  # noqa: E731
    return pd.DataFrame({
        "data seed": t["data seed"], "questions": t.questions,
        "steps (with / alone)": [f"{a} / {b}" for a, b in zip(t.steps, t["steps alone"])],
        "κ with the adapter [95%]": [ci_text(*r) for r in zip(t["κ"], t["κ lo"], t["κ hi"])],
        "κ alone [95%]": [ci_text(*r) for r in zip(t["κ alone"], t["κ alone lo"], t["κ alone hi"])],
        "Δκ [95%]": [ci_text(*r, "{:+.2f}") for r in zip(t["Δκ"], t["Δκ lo"], t["Δκ hi"])],
        "Δκ p (Holm)": [format_p(p) for p in t["Δκ p (Holm)"]],
        "ε pass@1 with / alone (%)": [f"{100 * a:.1f} / {100 * b:.1f}" for a, b in zip(t["ε pass@1"], t["ε pass@1 alone"])],
        "Δ ε pass@1 (pts)": [pts(*r) for r in zip(t["Δ pass@1"], t["Δ pass@1 lo"], t["Δ pass@1 hi"])],
        "Δ pass@1 p (Holm)": [format_p(p) for p in t["Δ pass@1 p (Holm)"]]})


def with_adapter_sentence(t: pd.DataFrame) -> str:
    """:func:`with_adapter_frame` in one sentence: on how many seeds adding the adapter raises or lowers kappa
    and the epsilon row's pass@1 (interval excluding 0 and Holm p < 0.05), with the mean of each difference."""
    def count(key):
        up = int(((t[f"{key} lo"] > 0) & (t[f"{key} p (Holm)"] < 0.05)).sum())
        down = int(((t[f"{key} hi"] < 0) & (t[f"{key} p (Holm)"] < 0.05)).sum())
        return up, down

    (ku, kd), (pu, pd_) = count("Δκ"), count("Δ pass@1")
    n = len(t)
    return say("mechanism", "with adapter", dk=format(t["Δκ"].mean(), "+.2f").replace("-", "−"),
               seeds=str(n) + (" data seeds" if n > 1 else " data seed"), ku=ku, kd=kd, pu=pu, pd=pd_,
               dp=format(100 * t["Δ pass@1"].mean(), "+.1f").replace("-", "−"))


def state_prompt_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`state_prompt_frame` for the page: kappa of both variants with intervals and n, the paired
    difference with Holm's p, pass@1 of both, and the state prompt's kappa at steps 1, 2 and 3+."""
    def iv(v, lo, hi, sign=False):
        f = "{:+.2f}" if sign else "{:.2f}"
        return ci_text(v, lo, hi, f)

    out = pd.DataFrame({
        "data seed": t["data seed"], "questions": t.questions,
        "state prompt κ (steps)": [f"{iv(a, b, c)} ({int(n)})"
                                   for a, b, c, n in zip(t["state prompt κ"], t["sp lo"], t["sp hi"], t["sp steps"])],
        "adapter κ (steps)": [f"{iv(a, b, c)} ({int(n)})"
                              for a, b, c, n in zip(t["adapter κ"], t["ad lo"], t["ad hi"], t["ad steps"])],
        "Δκ [95%]": [iv(a, b, c, sign=True) for a, b, c in zip(t["Δκ"], t["Δκ lo"], t["Δκ hi"])],
        "p (Holm)": t["p (Holm)"].map(format_p),
        "pass@1 state prompt (%)": (100 * t["state prompt pass@1"]).round(1),
        "pass@1 adapter (%)": (100 * t["adapter pass@1"]).round(1),
        "pass@1 Base (%)": [("—" if pd.isna(b) else f"{100 * b:.1f}") for b in t.get("Base pass@1", [math.nan] * len(t))]})
    for k in ("κ step 1", "κ step 2", "κ steps 3+"):
        if k in t:
            out[f"state prompt {k}"] = [("—" if pd.isna(v) else f"{v:.2f}".replace("-", "−")) for v in t[k]]
    return out


def steering_table(seeds: str | Path | None = None, prompts: list[Path] | None = None, option: str | Path | None = None,
                   mask: str | Path | None = None) -> str:
    """Finding 3's table: kappa [95%] against the independent-chain null with its n, on the data seeds other than
    the development one (named with their role, :func:`seed_words`), and whether it meets the criterion fixed before
    the runs: the adapter pooled over :func:`seeds_frame`'s seeds, the state prompt per seed (:func:`state_prompt_frame`),
    the state prompt through the stages and with the position mask (pooled where there are several seeds). "" when
    none of them is stored."""
    seeds = Path(seeds) if seeds else results_dir() / SEEDS_RESULT
    option = Path(option) if option else results_dir() / STAGE_OPTION_RESULT
    mask = Path(mask) if mask else results_dir() / POSITION_MASK_RESULT
    if prompts is None:
        prompts = sorted(results_dir().glob(STATE_PROMPT_RESULTS))
    rows = []

    def add(what, which, k, lo, hi, q, steps):
        met = "yes" if steers(k, lo) else "no"
        if met == "no" and k < KAPPA_BAR <= round(k, 2):  # shown at the threshold, yet below it
            met = f"no (κ = {k:.3f})"
        rows.append(f"| {what} | {seed_words(which)} | {ci_text(k, lo, hi)} | {int(q)} | {int(steps)} | {met} |")

    def pooled(what, t):
        per = t[t["data seed"].map(lambda x: isinstance(x, (int, np.integer)))]
        pool = t[t["data seed"] == "pooled"]
        r = pool.iloc[0] if len(per) > 1 and len(pool) else per.iloc[0]
        add(what, per["data seed"], r.kappa, r["kappa lo"], r["kappa hi"], r.questions, r.steps)

    if seeds.exists():
        pooled("the adapter", seeds_frame(seeds))
    if prompts:
        for _, r in state_prompt_frame(prompts, seeds=seeds if seeds.exists() else None).iterrows():
            add(f"the state prompt ({int(r['vectors per state'])} vectors per state)", [r["data seed"]], r["state prompt κ"],
                r["sp lo"], r["sp hi"], r.questions, r["sp steps"])
    if option.exists():
        pooled("the state prompt through the stages", stage_option_frame(option))
    if mask.exists():
        t = position_mask_frame(mask)
        pooled(f"the same, with the position mask (floor {t.attrs['floor']:g})", t)
    if not rows:
        return ""
    return "\n".join(["| conditioning | data seeds | κ [95% CI] | questions | steps | κ ≥ 0.5, lower bound > 0.3 |",
                      "|---|---|---:|---:|---:|---|", *rows]) + "\n"
