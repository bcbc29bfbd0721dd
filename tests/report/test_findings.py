"""Issue 35 items 1, 2 and 6: the first page opens with findings generated from the runs (ctrls.report.findings),
the scorecard comes in two blocks with direction columns and title links, and the GPU cost model and the
run-your-own page have their own pages."""
import json
import re
from pathlib import Path

import pandas as pd

from ctrls.config.schema import load_config
from ctrls.report import findings as fd
from ctrls.report import scorecard as sc
from ctrls.report.verdicts import OWN, PAPER, Claim, Estimate, scorecard_markdown, verdict_label
from ctrls.stats import power

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


# ---- item 2: the scorecard --------------------------------------------------------------------------


def test_scorecard_has_two_blocks_with_direction_columns_short_verdicts_and_title_links():
    md = scorecard_markdown(_claims(), "run X")
    paper, own = md.split("### The paper's claims")[1].split("### This book's own checks")
    assert md.index("### The paper's claims") < md.index("### This book's own checks")
    assert sc.PASS_CLAIM in paper and sc.RL_CLAIM in paper and sc.ABLATION_CLAIM not in paper
    assert sc.ABLATION_CLAIM in own and sc.CONTROL_CLAIM in own and "a synthetic claim" in own and sc.PASS_CLAIM not in own
    for block in (paper, own):
        header = next(line for line in block.splitlines() if line.startswith("| claim"))
        assert "| claimed |" in header and "found: direction, size" in header and "| verdict |" in header
    row = next(line for line in paper.splitlines() if sc.PASS_CLAIM in line)
    assert "| ↑ CTRLS(ε) − Base, pass@n |" in row and "↓ −7.5 points [−25.0, +10.0]" in row
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
                        "Δ vs Base": 0.25, "Δ lo": 0.1, "Δ hi": 0.4, "p (Holm)": 0.01}])
    control = sc.controllability_claim(ct, {"controllability": 12.0}, "generated/02_exploration")
    assert control.block == OWN and control.claimed == sc.CONTROL_DIR and control.estimates[0].d == 0.25
    assert all(c.block == OWN for c in sc.synthetic_claims(cfg))
    assert [c.block for c in sc.demo_claims(cfg)] == [PAPER, PAPER]  # Table 1 and RL: not run, the paper's claims
    assert sc.paper_power_claim().block == PAPER


# ---- item 1: the findings --------------------------------------------------------------------------


def test_paper_finding_is_the_paper_tables_counts():
    pw = power.paired_p_columns(power.paper_power())
    c = sc.paper_power_counts(pw)
    assert c["n"] == len(pw) and c["up"] + c["down"] + c["zero"] == len(pw)
    text = fd.paper_finding(c)
    assert f"Of its {len(pw)} CTRLS − Base differences" in text
    assert f"{c['up']} point up (↑), {c['down']} down (↓)" in text and f"{c['largest']:+.1f} points" in text
    # a table whose difference is resolvable changes the finding: the words come from the numbers
    wide = pw.copy()
    wide.loc[0, ["diff (pp)", "excludes 0", "p, minimal discordance"]] = 40.0, True, 0.001
    c2 = sc.paper_power_counts(wide)
    assert c2["excluding 0"] == c["excluding 0"] + 1 and c2["largest"] == 40.0
    assert fd.paper_finding(c2) != text and "+40.0 points" in fd.paper_finding(c2)


def test_demo_findings_are_the_scorecards_estimates_and_verdicts():
    two, three, four = fd.demo_findings(_claims())
    assert two.startswith("**CTRLS does not detectably change pass@n**") and "↓ −7.5 points [−25.0, +10.0]" in two
    assert "the demo detects about 31 points" in two
    assert "fixed s0 − Base): ↓ −12.5 points [−30.0, +5.0]" in two  # the adapter alone
    assert "↑ +20.0 points [+5.0, +35.0] (*supported*)" in two  # the transitions beyond the adapter
    assert three.startswith("**Steps follow their sampled state less often") and "↓ −4.0 points" in three
    assert four.startswith("**RL, Table 2: not run.**") and "the RL stage has not run" in four
    claims = _claims()
    claims[0].verdict, claims[0].estimates[0].d = "supported", 0.3
    assert fd.demo_findings(claims)[0].startswith("**CTRLS raises pass@n over Base**") and "↑ +30.0 points" in fd.demo_findings(claims)[0]


def test_scale_finding_reads_the_measured_hours(tmp_path):
    cfg = load_config("demo")
    d = json.loads(fd.GPU_RESULT.read_text())
    pair, h = next(iter(d["estimate_graph"]["pairs_hours"].items()))
    text = fd.scale_finding(cfg)
    assert text.startswith("**Nothing in this build ran at the paper's 3B scale**")
    assert "`ctrls reproduce --profile paper`" in text and f"**{h['mean']:.1f}–{h['cap']:.1f} H200-hours**" in text
    assert pair.split(" / ")[0] in text
    d["estimate_graph"]["pairs_hours"][pair] = {"mean": 11.11, "cap": 22.22}
    f = tmp_path / "m.json"
    f.write_text(json.dumps(d))
    assert "**11.1–22.2 H200-hours**" in fd.scale_finding(cfg, f)
    assert "not measured" in fd.scale_finding(cfg, tmp_path / "absent.json")
    paper = load_config("paper", ["grid.backbones=[Qwen/Qwen2.5-3B-Instruct]"])
    assert fd.scale_finding(paper).startswith("**This build ran the paper's backbone(s) Qwen/Qwen2.5-3B-Instruct.**")


def test_findings_page_is_at_most_five_with_the_forest_plot_and_its_provenance():
    items = [f"finding {i}" for i in range(1, 6)]
    md = fd.findings_markdown(items, "/generated/paper_forest.png")
    assert re.findall(r"^(\d)\. ", md, re.M) == ["1", "2", "3", "4", "5"]
    assert md.index("finding 1") < md.index("{figure} /generated/paper_forest.png") < md.index("finding 2")
    assert "`ctrls.report.findings.paper_forest(ctrls.stats.power.paper_power())`" in md and "`ctrls/report/paper.py`" in md


def test_forest_plot_has_one_point_per_paper_difference():
    pw = power.paired_p_columns(power.paper_power())
    fig = fd.paper_forest(pw)
    counts = [sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets") and len(c.get_offsets())
                  and c.get_label().startswith("CTRLS")) for ax in fig.axes]
    assert counts == list(pw.groupby("table", sort=False).size())
    assert [ax.get_title() for ax in fig.axes] == [f"{t} (n = {n} questions)" for t, n in
                                                   pw.groupby("table", sort=False).n.first().items()]


def test_write_findings_from_runs_that_did_not_run(tmp_path):
    cfg = load_config("smoke", {"run_dir": str(tmp_path / "runs")})
    path = fd.write_findings(cfg, tmp_path / "book")
    text = path.read_text()
    assert (tmp_path / "book" / "generated" / fd.FOREST).stat().st_size > 10_000
    assert "**Table 1: not run.**" in text and "**RL, Table 2: not run.**" in text
    assert "Nothing in this build ran at the paper's 3B scale" in text
    keys = (tmp_path / "book" / "generated" / "config_keys.md").read_text()
    row = next(line for line in keys.splitlines() if line.startswith("| `states.n_states`"))
    assert f"| {load_config('demo').states.n_states} | {load_config('paper').states.n_states} |" in row
    assert "--profile paper -o" in (tmp_path / "book" / "generated" / "paper_pair.md").read_text()


# ---- items 1 and 6: the pages ----------------------------------------------------------------------


def test_intro_opens_with_the_findings_then_the_scorecard():
    intro = (BOOK / "intro.md").read_text()
    sections = re.findall(r"^## (.+)$", intro, re.M)
    assert sections[:2] == ["What this book finds", "Claims scorecard"]
    assert intro.index("generated/findings.md") < intro.index("generated/scorecard.md")
    # nothing but the title and one short paragraph before the findings
    assert len(intro[:intro.index("## What this book finds")].split()) < 60


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


# ---- item 7: the summary's forest plot, Table 3 once ---------------------------------------------


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


def test_mechanism_note_states_each_studied_variant_beside_its_coincidence(tmp_path):
    """Finding 3's mechanism sentence is read from the stored studies: every point of the scaling
    result and every injection row, each rate with its coincidence, and whether any meets the goal."""
    from ctrls.report.studies import INJECTION_RESULT
    from tests.method.test_controls import _point

    inj = Path(__file__).resolve().parents[2] / INJECTION_RESULT
    sc = tmp_path / "scaling.json"
    sc.write_text(json.dumps({"points": [_point(300, 0.078), _point(75, 0.08)]}))
    ks = tmp_path / "states.json"
    ks.write_text(json.dumps({"points": [{**_point(64, 0.2), "K": 16}, {**_point(64, 0.25), "K": 4}]}))
    text = fd.mechanism_note(scaling=sc, injection=inj, states=ks)
    assert "follow their drawn state 25.0% at K = 4 (10.0%; κ = 0.17), 20.0% at K = 16 (10.0%; κ = 0.11)" in text
    assert "8.0% at 75 chains (10.0%), 7.8% at 300 chains (10.0%)" in text  # in order of chains
    assert "14.2% injected at the last hidden state (4.8%)" in text  # studies/results/injection.json
    assert text.endswith("None reaches the 40% and 3× coincidence that steering would need. By κ, which does not "
                         "favour many states, K = 4 steers most (κ = 0.17; 3× coincidence would need 30% there).")
    fu = tmp_path / "fusion.json"  # a token-dependent F_u at K = 4, paired with the sweep's K = 4 point
    fu.write_text(json.dumps({"points": [{**_point(64, 0.5), "K": 4, "fusion": "mlp", "follows_lo": 0.45}]}))
    text = fd.mechanism_note(scaling=sc, injection=inj, states=ks, fusion=fu)
    assert "; with a token-dependent F_u (`adapter.fusion: mlp`), 50.0% at K = 4 (10.0%). 1 of these variants reaches" in text
    ks.write_text(json.dumps({"points": [{**_point(64, 0.05), "K": 4}]}))
    assert "5.0% at K = 4 (10.0%; κ = −0.06)" in fd.mechanism_note(scaling=sc, injection=inj, states=ks)
    sc.write_text(json.dumps({"points": [_point(1200, 0.45)]}))
    assert "1 of these variants reaches the 40% and 3× coincidence that steering would need." in \
        fd.mechanism_note(scaling=sc, injection=inj, states=ks)
