"""The first page opens with findings generated from the runs (ctrls.report.findings),
the scorecard comes in two blocks with direction columns and title links, and the GPU cost model and the
run-your-own page have their own pages."""
import json
import re
from pathlib import Path

import pandas as pd

from ctrls.config.schema import load_config
from ctrls.report import findings as fd
from ctrls.report import paper_power
from ctrls.report import scorecard as sc
from ctrls.report.verdicts import OWN, PAPER, Claim, Estimate, scorecard_markdown, verdict_label

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"


def _claims():
    return [Claim(sc.PASS_CLAIM, "Table 1", "ev", "not supported: the estimate is in the opposite direction (−7.5 points)",
                  "generated/02_exploration", claimed=sc.PASS_DIR, mdd=31.0,
                  estimates=[Estimate("wp eps=0.1 (η=0.7)", -0.075, -0.25, 0.1)]),
            Claim(sc.ABLATION_CLAIM, "Sec. 4", "ev", "supported", "generated/02_exploration", block=OWN,
                  claimed=sc.ABLATION_DIR, estimates=[Estimate("wp eps=0.1 − fixed s0", 0.2, 0.05, 0.35)],
                  beside=[Estimate("wp fixed s0 − Base", -0.125, -0.3, 0.05)]),
            Claim(sc.CONTROL_CLAIM, "Eq. 8", "ev", "contradicted", "generated/02_exploration", block=OWN,
                  claimed=sc.CONTROL_DIR, estimates=[Estimate("wp eps=0.1", -0.04, -0.07, -0.01)]),
            Claim(sc.RL_CLAIM, "Alg. 2", "the RL stage has not run", "not run", "generated/03_rl", claimed=sc.RL_DIR),
            Claim("a synthetic claim", "App. C.1", "ev", "not supported: the estimate is zero (+0)", "generated/07_synthetic",
                  block=OWN, claimed="↑ a − b", estimates=[Estimate("", 0.0, -0.3, 0.3, scale=1, unit="")])]


# ---- the scorecard --------------------------------------------------------------------------


def test_scorecard_has_two_blocks_with_direction_columns_short_verdicts_and_title_links():
    md = scorecard_markdown(_claims(), "run X")
    paper, own = md.split("### The paper's claims")[1].split("### This book's own checks")
    assert md.index("### The paper's claims") < md.index("### This book's own checks")
    assert sc.PASS_CLAIM in paper and sc.RL_CLAIM in paper and sc.ABLATION_CLAIM not in paper
    assert sc.ABLATION_CLAIM in own and sc.CONTROL_CLAIM in own and "a synthetic claim" in own and sc.PASS_CLAIM not in own
    for block in (paper, own):
        header = next(line for line in block.splitlines() if line.startswith("| claim"))
        assert "| claimed |" in header and "found: direction, size" in header and "| verdict |" in header
        assert header.index("verdict") < header.index("found") < header.index("claimed")  # what a phone shows first
    row = next(line for line in paper.splitlines() if sc.PASS_CLAIM in line)
    assert "| ↑ CTRLS(ε) − Base, pass@n |" in row and "↓ −7.5 points [−25.0, +10.0]" in row
    assert row.index("**not supported**") < row.index("↓ −7.5 points")
    assert "| **not supported** |" in row and "opposite direction" not in row  # the verdict cell is the label alone
    assert "detectable: about 31 points" in row
    # the page is linked by its title: {doc} with no text of its own, never a slug
    assert "{doc}`/generated/02_exploration`" in row and "02_exploration <" not in md
    assert "the RL stage has not run" in md  # a row with nothing measured says why


def test_verdict_labels_are_short():
    assert verdict_label("not supported: the estimate is zero (+0.0 points) (the demo detects about 9 points)") == "not supported"
    assert verdict_label("unreadable: /x/part.parquet") == "unreadable"
    assert verdict_label("supported") == "supported" and verdict_label("Table 1: none resolvable") == "Table 1: none resolvable"


def test_the_scorecards_claims_sit_in_their_blocks(tmp_path):
    cfg = load_config("smoke", {"run_dir": str(tmp_path)})
    ct = pd.DataFrame([{"dataset": "wp", "K": 4, "follows": 0.5, "Base, random states": 0.25, "config": "eps=0.1",
                        "Δ vs Base": 0.25, "Δ lo": 0.1, "Δ hi": 0.4, "p (Holm)": 0.01, "steps": 100, "questions": 10,
                        "null": 0.25, "null steps": 100, "κ": 1 / 3, "κ lo": 0.1, "κ hi": 0.5, "p (κ, Holm)": 0.01}])
    control = sc.controllability_claim(ct, {"controllability": 12.0}, "generated/02_exploration")
    assert control.block == OWN and control.claimed == sc.CONTROL_DIR and control.estimates[0].d > 0
    assert all(c.block == OWN for c in sc.synthetic_claims(cfg))
    assert [c.block for c in sc.demo_claims(cfg)] == [PAPER, PAPER]  # Table 1 and RL: not run, the paper's claims
    assert sc.paper_power_claim().block == PAPER


# ---- the findings (short sentences, each number with its interval and n) -----------


def test_paper_finding_is_the_paper_tables_counts():
    pw = paper_power.paired_p_columns(paper_power.paper_power())
    c = sc.paper_power_counts(pw)
    assert c["n"] == len(pw) and c["up"] + c["down"] + c["zero"] == len(pw)
    text = fd.paper_finding(c)
    assert f"Of its {len(pw)} CTRLS − Base differences" in text
    assert f"{c['up']} point up, {c['down']} down" in text and f"{c['largest']:+.1f} points" in text
    assert "(n = 40)" in text and "(n = 500)" in text and "infer it <glossary-inferred-n>" in text
    # a table whose difference is resolvable changes the finding: the words come from the numbers
    wide = pw.copy()
    wide.loc[0, ["diff (pp)", "excludes 0", "p, minimal discordance"]] = 40.0, True, 0.001
    c2 = sc.paper_power_counts(wide)
    assert c2["excluding 0"] == c["excluding 0"] + 1 and c2["largest"] == 40.0
    assert fd.paper_finding(c2) != text and "+40.0 points" in fd.paper_finding(c2)
    assert fd.paper_finding(c2).startswith("**The paper's own tables show some CTRLS − Base differences**")


def test_paper_table_gives_each_tables_inferred_n_and_counts():
    pw = paper_power.paired_p_columns(paper_power.paper_power())
    md = fd.paper_table_markdown(pw)
    rows = [line for line in md.splitlines() if line.startswith("| Table")]
    assert [r.split(" | ")[1] for r in rows] == ["40", "500"]
    assert "n (inferred)" in md.splitlines()[0]
    for t, r in zip(fd.paper_tables(pw), rows):
        assert f"| {t['differences']} | {t['up']} / {t['down']} / {t['zero']} |" in r


def test_demo_findings_are_the_scorecards_estimates_and_verdicts():
    sizes = {"questions": {"wp": 60}, "rl": {}}
    two, three, four = fd.demo_findings(_claims(), sizes)
    assert two.startswith("**CTRLS does not detectably change pass@n**") and "↓ −7.5 [−25.0, +10.0]" in two
    assert "about 31 points" in two
    assert "| wp fixed s0 − Base | the adapter alone | 60 | ↓ −12.5 [−30.0, +5.0] |" in two  # the adapter alone
    assert "| wp eps=0.1 − fixed s0 | the transitions beyond the adapter | 60 | ↑ +20.0 [+5.0, +35.0] |" in two
    assert "it is *supported*" in two
    assert three.startswith("**Steps land in their drawn state less often than by chance**")
    assert "↓ −4.0 [−7.0, −1.0]" in three
    assert four.startswith("**RL on the transition policy (Table 2): not run**")
    assert "Its stage has not run for this build's profile." in four and "the RL stage has not run" not in four
    claims = _claims()
    claims[0].verdict, claims[0].estimates[0].d = "supported", 0.3
    assert (fd.demo_findings(claims)[0].startswith("**CTRLS raises pass@n over Base**")
            and "↑ +30.0" in fd.demo_findings(claims)[0])


def test_every_headline_agrees_with_its_verdict():
    """A finding's headline is the verdict sentence's clause for the same claim, and says what its label says."""
    from ctrls.config.schema import load_config

    counts = sc.paper_power_counts(paper_power.paired_p_columns(paper_power.paper_power()))
    cfg = load_config("demo")
    for label in ("supported", "contradicted", "not supported: the estimate is zero (+0)", "mixed"):
        claims = _claims()
        for c in claims[:4]:
            c.verdict = label
            c.estimates = c.estimates or [Estimate("`none`", 0.0, -0.1, 0.1)]
        findings = fd.demo_findings(claims)
        verdict = " ".join(fd.verdict_sentences(cfg, claims, counts))
        for f in findings:
            head = re.match(r"\*\*(.+?)\*\*", f).group(1)
            clause = head if head.startswith(("CTRLS", "RL")) else head[0].lower() + head[1:]
            assert clause in verdict, (label, head)
            assert ("not" in head.split()) == label.startswith("not supported") or "less often" in head, (label, head)
    assert not any("supported" in h.lower() and "not" not in h.lower() for h in fd.HEADS["pass"].values())


def test_the_verdict_has_three_sentences_with_the_scale_caveat():
    from ctrls.config.schema import load_config

    counts = sc.paper_power_counts(paper_power.paired_p_columns(paper_power.paper_power()))
    one, two, three = fd.verdict_sentences(load_config("demo"), _claims(), counts)
    assert one.startswith("The paper's own tables cannot show that CTRLS beats Base") and "40 in Table 1" in one
    assert two.startswith("Nothing here ran at the paper's 3B scale") and "smollm2-135m-instruct" in two
    assert three.startswith("On this build's run, CTRLS does not detectably change pass@n")
    assert "RL on the transition policy (Table 2) was not run" in three
    md = fd.verdict_markdown([one, two, three])
    assert md.startswith("```{admonition} The verdict") and md.count("\n") == 4


def test_scale_finding_reads_the_measured_hours(tmp_path):
    cfg = load_config("demo")
    d = json.loads(fd.GPU_RESULT.read_text())
    pair, h = next(iter(d["estimate_graph"]["pairs_hours"].items()))
    text = fd.scale_finding(cfg)
    assert text.startswith("**Nothing in this build ran at the paper's 3B scale.**")
    assert "`ctrls reproduce --profile paper`" in text and f"**{h['mean']:.1f}–{h['cap']:.1f} H200-hours**" in text
    assert pair.split(" / ")[0] in text
    d["estimate_graph"]["pairs_hours"][pair] = {"mean": 11.11, "cap": 22.22}
    f = tmp_path / "m.json"
    f.write_text(json.dumps(d))
    assert "**11.1–22.2 H200-hours**" in fd.scale_finding(cfg, f)
    assert "have not been measured" in fd.scale_finding(cfg, tmp_path / "absent.json")
    assert "absent.json" not in fd.scale_finding(cfg, tmp_path / "absent.json")  # no file name in the prose
    paper = load_config("paper", ["grid.backbones=[Qwen/Qwen2.5-3B-Instruct]"])
    assert fd.scale_finding(paper).startswith("**This build ran the paper's backbone Qwen/Qwen2.5-3B-Instruct.**")


def test_findings_page_is_at_most_five_with_the_forest_plot_and_its_provenance():
    items = [f"finding {i}" for i in range(1, 6)]
    md = fd.findings_markdown(items, "/generated/paper_forest.png", "| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert re.findall(r"^(\d)\. ", md, re.M) == ["1", "2", "3", "4", "5"]
    assert (md.index("finding 1") < md.index("   | a | b |") < md.index("{image} /generated/paper_forest.png")
            < md.index("finding 2"))
    assert f"**Figure {fd.FIGURE}.**" in md and "`ctrls.report.findings.paper_forest`" in md
    # a finding's table stays inside its list item (indented)
    md = fd.findings_markdown(["one", "two\n\n| x |\n|---|", "3", "4", "5"])
    assert "\n   | x |\n   |---|\n" in md


def test_write_findings_from_runs_that_did_not_run(tmp_path):
    cfg = load_config("smoke", {"run_dir": str(tmp_path / "runs")})
    path = fd.write_findings(cfg, tmp_path / "book", sc.demo_claims(cfg))
    text = path.read_text()
    assert (tmp_path / "book" / "generated" / fd.FOREST).stat().st_size > 10_000
    assert "**CTRLS against Base (Table 1): not run**" in text and "**RL on the transition policy (Table 2): not run**" in text
    assert "Nothing in this build ran at the paper's 3B scale" in text
    verdict = (tmp_path / "book" / "generated" / "verdict.md").read_text()
    assert "Nothing here ran at the paper's 3B scale" in verdict
    keys = (tmp_path / "book" / "generated" / "config_keys.md").read_text()
    row = next(line for line in keys.splitlines() if line.startswith("| `states.n_states`"))
    assert f"| {load_config('demo').states.n_states} | {load_config('paper').states.n_states} |" in row
    assert "--profile paper -o" in (tmp_path / "book" / "generated" / "paper_pair.md").read_text()


# ---- items 1 and 6: the pages ----------------------------------------------------------------------


def test_intro_opens_with_the_verdict_then_the_findings_then_the_scorecard():
    intro = (BOOK / "intro.md").read_text()
    sections = re.findall(r"^## (.+)$", intro, re.M)
    assert sections[:2] == ["What this book finds", "Claims scorecard"]
    assert intro.index("generated/verdict.md") < intro.index("## What this book finds")
    assert intro.index("generated/findings.md") < intro.index("generated/scorecard.md")
    # nothing but the title and one short paragraph before the verdict: it is on the first screen
    assert len(intro[:intro.index("generated/verdict.md")].split()) < 60


def test_gpu_cost_model_has_its_own_page_and_every_anchor_to_it_resolves():
    toc = (BOOK / "_toc.yml").read_text()
    assert "file: gpu_cost" in toc and "file: run_your_own" in toc
    assert toc.index("file: run_your_own") < toc.index("caption: Appendices") < toc.index("file: gpu_cost")
    reproduce, cost = (BOOK / "reproduce.md").read_text(), (BOOK / "gpu_cost.md").read_text()
    for inc in ("gpu_estimate_h100.md", "gpu_measured_h100.md", "gpu_measured_graph.md"):
        assert inc in cost and inc not in reproduce
    pages = {p: p.read_text() for p in [*BOOK.glob("*.md"), *(BOOK / "_includes").glob("*.md")]}
    labels = {m for t in pages.values() for m in re.findall(r"^\(([\w-]+)\)=$", t, re.M)}
    for p, t in pages.items():
        for ref in re.findall(r"\{ref\}`(?:[^`<]*<)?([\w-]+)>?`", t):
            assert ref in labels, f"{p.name}: {{ref}} {ref} has no target"
        # a same-page anchor must be on the same page (the GPU sections moved)
        own = set(re.findall(r"^\(([\w-]+)\)=$", t, re.M))
        if p.parent.name == "_includes":
            own = set(re.findall(r"^\(([\w-]+)\)=$", cost, re.M))
        for a in re.findall(r"\]\(#([\w-]+)\)", t):
            assert a in own or a.startswith("src-"), f"{p.name}: #{a} is on another page"


def test_run_your_own_page_has_the_format_the_keys_the_command_and_the_outputs():
    page = (BOOK / "run_your_own.md").read_text()
    for needed in ('"question"', '"answer"', "train.jsonl", "backbone.name=", "generated/config_keys.md",
                   "generated/paper_pair.md", "## Reading the outputs", "runs/<profile>/<stage>/"):
        assert needed in page, needed
    assert not re.search(r"\b\d+(\.\d+)?\s*(GPU-)?hours?\b", page)  # the hours come from the include
    keys = fd.config_keys_markdown()
    for key in ("states.n_states", "spectral.k", "states.tau", "adapter.rank", "pretrain.epochs"):
        assert f"`{key}`" in keys


# ---- the summary's forest plot, Table 3 once ---------------------------------------------


def _code_cells(name):
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_summary_shows_the_forest_plot_and_folds_the_80_row_table():
    cells = _code_cells("06_summary.ipynb")
    forest = next(i for i, c in enumerate(cells) if "findings.paper_forest(pw)" in "".join(c["source"]))
    folded = next(i for i, c in enumerate(cells) if "power.power_view(pw)" in "".join(c["source"]))
    assert forest < folded and "hide-output" in cells[folded]["metadata"]["tags"]
    assert "power_view" not in "".join(cells[forest]["source"])


def test_the_papers_table_3_is_shown_once_in_the_book():
    code = ["".join(c["source"]) for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) for c in _code_cells(nb.name)]
    assert sum(s.count("table3_vs_paper(") for s in code) == 1
    assert not any(s.strip().splitlines()[-1].strip() in ("paper.PAPER_TABLE3", "PAPER_TABLE3") for s in code if s.strip())


def test_the_rl_pages_link_to_the_synthetic_study_resolves_by_its_title():
    from ctrls.report.tables import synthetic_link

    link = synthetic_link()
    nb = json.loads((ROOT / "notebooks" / "07_synthetic.ipynb").read_text())
    title = "".join(nb["cells"][0]["source"]).splitlines()[0][2:]
    assert link == f"[{title}](07_synthetic.html)"  # the built page beside the RL page, never the .ipynb (a 404)


def test_mechanism_note_is_one_short_sentence_from_the_stored_studies(tmp_path):
    """Finding 3's mechanism sentence is read from the stored studies: how many variants, the range of κ,
    the variant that steers most; no threshold the book does not justify."""
    from ctrls.report.studies import INJECTION_RESULT
    from tests.report.test_studies import _point

    inj = Path(__file__).resolve().parents[2] / INJECTION_RESULT
    sc_ = tmp_path / "scaling.json"
    sc_.write_text(json.dumps({"points": [_point(300, 0.078), _point(75, 0.08)]}))
    ks = tmp_path / "states.json"
    ks.write_text(json.dumps({"points": [{**_point(64, 0.2), "K": 16}, {**_point(64, 0.25), "K": 4}]}))
    v = fd.mechanism_variants(scaling=sc_, injection=inj, states=ks)
    assert len(v) == 2 + 2 + 2 and v.kappa.max() > 0
    text = fd.mechanism_note(scaling=sc_, injection=inj, states=ks)
    assert text.startswith("On data seed 0, where the choices were made, the pretraining page's 6 stored variants")
    assert f"to {v.kappa.max():.2f}, highest for {v.loc[v.kappa.idxmax()].variant}." in text
    assert "40%" not in text and "3×" not in text and "would need" not in text
    assert len(text.split()) <= 40
    fu = tmp_path / "fusion.json"  # a token-dependent F_u at K = 4, paired with the sweep's K = 4 point
    fu.write_text(json.dumps({"points": [{**_point(64, 0.5), "K": 4, "fusion": "mlp", "follows_lo": 0.45}]}))
    assert "highest for a token-dependent F_u at K = 4." in fd.mechanism_note(scaling=sc_, injection=inj, states=ks, fusion=fu)
    ks.write_text(json.dumps({"points": [{**_point(64, 0.05), "K": 4}]}))
    assert "rate) from −0.06" in fd.mechanism_note(scaling=sc_, injection=inj, states=ks)


def test_seeds_note_is_a_table_of_kappa_by_seed_role_with_n(tmp_path):
    """Finding 3's numbers on the other data seeds: a table, each κ with its interval and n, each seed named
    with its role, the adapter pooled, never the development seed's number."""
    from tests.report.test_mechanism import kappa, seed

    none = tmp_path / "absent.json"
    p = tmp_path / "seeds.json"
    pooled = {**kappa(0.08, 0.03, 0.13), "questions": 180, "steps": 1500}
    p.write_text(json.dumps({"margin_points": 5, "seeds": [seed(1), seed(2), seed(3)], "pooled_kappa": pooled,
                             "development": [seed(0, k=0.14, lo=0.06, hi=0.21)]}))
    text = fd.seeds_note(p, prompts=[], option=none, mask=none)
    assert "| the adapter | validation data seeds 1, 2 and 3 | 0.08 [0.03, 0.13] | 180 | 1500 | no |" in text
    assert "0.14" not in text and "95–97%" not in text and "state prompt" not in text
    assert fd.seeds_note(none, prompts=[], option=none, mask=none) == ""
    sp = tmp_path / "state_prompt_seed1.json"  # a stored state-prompt run: its own row
    sp.write_text(json.dumps({"data_seed": 1, "vectors_per_state": 2,
                              "state_prompt": {**kappa(0.4972, 0.43, 0.56), "pass1": 0.2},
                              "adapter": {**kappa(0.08, 0.01, 0.15), "pass1": 0.25},
                              "state_prompt_minus_adapter": {"diff": 0.33, "lo": 0.2, "hi": 0.46, "p_value": 0.001}}))
    text = fd.seeds_note(p, prompts=[sp], option=none, mask=none)
    assert ("| the state prompt (2 vectors per state) | validation data seed 1 | 0.50 [0.43, 0.56] | 60 | 678 | "
            "no (κ = 0.497) |") in text
    opt = tmp_path / "state_prompt_stage.json"  # the stage option on two confirmation seeds: pooled
    opt.write_text(json.dumps({"commit": "abc", "margin_points": 5, "overrides": ["state_prompt.use=true"],
                               "seeds": [seed(6, k=0.63, lo=0.57, hi=0.69), seed(7)], "pooled_kappa": kappa(0.6, 0.55, 0.65)}))
    text = fd.seeds_note(p, prompts=[sp], option=opt, mask=none)
    assert "| the state prompt through the stages | confirmation data seeds 6 and 7 | 0.60 [0.55, 0.65] | 60 | 678 | yes" in text
    assert text.index("the adapter") < text.index("state prompt (2") < text.index("through the stages")
    assert len(text.split("\n\n")[0].split()) <= 40
