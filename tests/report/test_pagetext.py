"""The run pages say what ran. The exploration page's headline box takes each family's comparison
with the smallest Holm-adjusted p (not the first row of a table), and folds the rest in a dropdown, not in a
folded code cell; the RL page names the settings that ran; the stored studies' tables give every rate in %
with its interval."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ctrls.report import pagetext
from tests.report.test_synthetic_figures import _exploration_frames


def test_the_headline_box_takes_the_smallest_adjusted_p_of_each_family():
    table, ablation, control = _exploration_frames()
    # a second ablation row whose Succ. difference is the family's smallest p, and a second control row
    ablation = pd.concat([ablation, ablation.assign(comparison="eps=0.1 − fixed s0", **{"p (Succ., Holm)": 0.002,
                                                                                       "Δ Succ.": 0.13})])
    control.loc[1, "p (Holm)"] = 0.0015
    key, others = pagetext.exploration_headlines(table, ablation, control)
    assert len(key) == 3
    assert "eps=0.3 vs Base" in key[0]  # Table 1: p = 0.04, the smallest
    assert "ablation, eps=0.1 − fixed s0, Succ." in key[1]  # not the first row's pass@n
    assert "controllability, eps=0.3" in key[2]  # not the first row
    assert not set(key) & set(others) and len(key) + len(others) == 1 + 3 + 2 * 2 + 2


def test_the_headline_prefers_the_claims_own_test_when_the_table_has_it():
    table, ablation, control = _exploration_frames()
    control = control.assign(**{"κ": [0.1, 0.3], "κ lo": [-0.1, 0.1], "κ hi": [0.3, 0.5], "p (κ, Holm)": [0.5, 0.01],
                                "null": 0.2, "null steps": 10})
    fam = pagetext.exploration_families(table, ablation, control)
    assert [f for f, _ in fam].count("control κ") == 2
    key, _ = pagetext.exploration_headlines(table, ablation, control)
    if any("independent-chain null" in s for s in key):  # the verdicts module writes the κ sentences
        assert "eps=0.3, against the independent-chain null" in key[2]


def test_the_other_comparisons_fold_into_a_dropdown():
    md = pagetext.folded(["a.", "b."], "The other 2 comparisons")
    assert md.startswith(":::{admonition} The other 2 comparisons\n:class: dropdown\n") and "- a.\n- b.\n:::" in md
    assert pagetext.folded([], "x") == ""


def test_the_rl_page_names_the_settings_that_ran():
    curves = pd.DataFrame([dict(setting=s, epsilon=e, alpha=a) for s, e, a in (("none", 0.0, 0.0), ("both", 0.1, 0.01))])
    text = pagetext.rl_settings_note(curves, ["none", "both"])
    assert text.startswith("2 settings ran: `none` (ε = 0, α = 0); `both` (ε = 0.1, α = 0.01).")
    assert "The paper's other settings, `epsilon`, `entropy`, run in the `paper` profile, which runs all four." in text
    from ctrls.config.schema import load_config

    assert load_config("paper").rl.settings == ["none", "epsilon", "entropy", "both"]  # the sentence's claim
    assert "Asked for but not in the curves: `epsilon`." in pagetext.rl_settings_note(curves, ["none", "both", "epsilon"])
    assert "four curves" not in text


def test_the_injection_table_gives_percent_with_intervals():
    df = pd.DataFrame([dict(injection="input embeddings (Alg. 1)", posterior=0.3, shuffled=-0.05, random=-1.0,
                            follows=0.507, follows_lo=0.451, follows_hi=0.564, coincidence=0.295, coincidence_lo=0.244,
                            coincidence_hi=0.352, **{"pass@1": 0.1125, "Succ.": 0.8875, "Base pass@1": 0.075,
                                                     "Base Succ.": 0.76})])
    df.attrs["questions"] = 20
    v = pagetext.injection_view(df)
    row = v.iloc[0]
    assert row["injected at"] == "input embeddings (our reading of Alg. 2)"
    assert row["follows its state (%)"] == "50.7 [45.1, 56.4]" and row["by coincidence (%)"] == "29.5 [24.4, 35.2]"
    assert row["pass@1 (%)"].startswith("11 [") and row["Succ. (%)"].startswith("89 [")
    assert row["κ"] == "0.30" and row["own state − shuffled (nats/token)"] == "+0.350"
    assert "each of the 20 test questions once" in v.attrs["note"]
    assert not any(isinstance(x, float) and x < 1 for x in np.ravel(v.to_numpy()))  # no raw fraction left


def test_the_k_sweep_and_fusion_sentences():
    ks = pd.DataFrame([dict(K=k, follows=f, coincidence=c, harm=0.0, follows_lo=f - 0.05, follows_hi=f + 0.05,
                            fusion="linear") for k, f, c in ((2, 0.59, 0.61), (4, 0.435, 0.254), (8, 0.21, 0.14))])
    text = pagetext.k_sweep_sentence(ks, demo_k=4)
    assert text.startswith("K = 4 steers most: κ = 0.24") and text.endswith("The demo uses K = 4, this K.")
    fu = pd.concat([ks[ks.K == 4], ks[ks.K == 4].assign(fusion="mlp", follows=0.387, follows_lo=0.341, follows_hi=0.435)])
    assert "the linear F_u steers more by κ (0.24 against 0.18); the two follows intervals overlap" in \
        pagetext.fusion_sentence(fu)


def test_the_rl_verdict_table_gives_each_accuracy_with_its_interval():
    from ctrls.report import plots
    from ctrls.report.verdicts import rl_verdicts
    from tests.report.test_plots_legibility import rl_curves

    curves = rl_curves()
    t = rl_verdicts(curves)
    v = pagetext.rl_verdicts_table(t, curves)
    none = curves[(curves.setting == "none") & (curves.kind == "eval")]
    p = plots.pooled_accuracy(none)
    first = p.iloc[0]
    assert v.loc[v.setting == "none", "accuracy at step 0 (%)"].item() == \
        f"{100 * first.rate:.1f} [{100 * first.lo:.1f}, {100 * first.hi:.1f}]"
    assert all(" [" in x for x in v["accuracy at the end (%)"])
    assert np.isclose(100 * t.loc[t.setting == "none", "accuracy at step 0"].item(), 100 * first.rate)
