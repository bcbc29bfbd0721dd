"""One validating reader for every stored result (ctrls.report.stored). The
readers behind the pretraining page and the first page refuse, naming the file and the field, what they
printed or crashed on: NaN, ±Infinity and null, rates outside [0, 1], an interval that does not contain its
estimate, a non-integer or small K, a coincidence of 0 or 1, non-finite GPU-hours, a machine that is not an
object, a file nested 100,000 deep, an unreadable GPU result, an empty list. They read from a root they are
given, else $CTRLS_RESULTS_DIR, else the repository."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from ctrls.config.schema import load_config
from ctrls.report import findings as fd
from ctrls.report import scorecard as sc
from ctrls.report import studies as st
from ctrls.report.stored import COMMITTED, ENV, REPO, StoredResultError, read

ROOT = Path(__file__).resolve().parents[2]
SCALING = ROOT / "studies" / "results" / "steering_scaling_k4.json"
GENERATION = ROOT / "studies" / "results" / "generation_controls.json"
INJECTION = ROOT / "studies" / "results" / "injection_k4.json"
PILOT = ROOT / "studies" / "results" / "word_problems_difficulty.json"
GPU = ROOT / "bench" / "results" / "gpu_estimate_measured_nvidia_h200_qwen.json"


def _write(tmp_path, d, name="r.json") -> Path:
    f = tmp_path / name
    f.write_text(json.dumps(d))
    return f


def _refused(fn, f: Path, field: str):
    """``fn(f)`` raises the one error class, naming the file and the field."""
    with pytest.raises(StoredResultError) as e:
        fn(f)
    assert str(f) in str(e.value) and field in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError) and e.value.field.startswith(field.split(":")[0])
    return str(e.value)


@pytest.mark.parametrize("rel", sorted(COMMITTED))
def test_every_committed_result_passes_its_schema(rel):
    assert REPO == ROOT
    read(ROOT / rel, COMMITTED[rel])


def test_the_committed_results_read_through_the_page_readers():
    assert len(st.scaling_frame(st.scaling_result_paths())) and len(st.generation_frame(GENERATION))
    assert all(len(st.injection_frame(p)) for p in st.injection_result_paths())
    assert len(st.fusion_frame(st.states_result_path(), st.fusion_result_path()))
    assert sc.pilot(load_config("demo"))["difficulty"] == load_config("demo").data.word_problems.difficulty().tag()
    assert "H200-hours" in fd.scale_finding(load_config("demo"))


# ---- the steering results (the pretraining page, finding 3) ---------------------------------------------

def _scaling():
    return json.loads(SCALING.read_text())


@pytest.mark.parametrize("point_key,value,field", [
    ("follows_lo", float("nan"), "points[0].follows_lo"),  # NaN in a field beside the three checked before
    ("coincidence_hi", float("inf"), "points[0].coincidence_hi"),
    ("follows_hi", None, "points[0].follows_hi"),
    ("follows", 1.7, "points[0].follows"),  # printed "170.0%"
    ("follows_lo", 0.9, "points[0].follows"),  # "43.5% [90.0, 49.4]": the interval does not hold its estimate
    ("K", 2.5, "points[0].K"),  # printed "K = 2"
    ("K", 0, "points[0].K"),
    ("K", 1, "points[0].K"),
    ("coincidence", 1.0, "points[0].coincidence"),  # kappa printed as −inf
    ("coincidence", 0.0, "points[0].coincidence"),  # "(inf×)"
    ("chains", "300", "points[0].chains"),
    ("sources", 7, "points[0].sources"),
    ("overrides", "states.n_states=4", "points[0].overrides"),
])
def test_a_bad_steering_point_is_refused_naming_the_file_and_field(tmp_path, point_key, value, field):
    d = _scaling()
    d["points"][0][point_key] = value
    msg = _refused(st.scaling_frame, _write(tmp_path, d), field)
    assert "not a readable studies/steering.py result" in msg


@pytest.mark.parametrize("path,value,field", [
    (("harm_fixed_s0", "lo"), float("-inf"), "points[1].harm_fixed_s0.lo"),
    (("harm_eps", "diff"), None, "points[1].harm_eps.diff"),
    (("harm_eps", "hi"), -0.5, "points[1].harm_eps.diff"),  # the interval [lo, -0.5] does not hold the diff
    (("pass1", "Base", "rate"), float("nan"), "points[1].pass1.Base.rate"),
    (("pass1", "Base", "rate"), 1.2, "points[1].pass1.Base.rate"),
])
def test_nested_fields_of_a_steering_point_are_checked(tmp_path, path, value, field):
    d = _scaling()
    node = d["points"][1]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    _refused(st.scaling_frame, _write(tmp_path, d), field)


@pytest.mark.parametrize("machine", ["AMD EPYC", ["x"], 3])
def test_a_machine_that_is_not_an_object_is_refused(tmp_path, machine):
    d = _scaling()
    d["machine"] = machine
    _refused(st.scaling_frame, _write(tmp_path, d), "machine")


def test_an_empty_or_missing_points_list_is_refused(tmp_path):
    for d, field in (({"points": []}, "points"), ({"commit": "x"}, "points"), ([], "")):
        f = _write(tmp_path, d)
        with pytest.raises(StoredResultError, match="points" if field else "not an object") as e:
            st.scaling_frame(f)
        assert str(f) in str(e.value)
        with pytest.raises(StoredResultError):
            st.generation_frame(f)


def test_a_result_nested_100000_deep_is_refused_before_it_is_parsed(tmp_path):
    f = tmp_path / "deep.json"
    f.write_text('{"points": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for reader in (st.scaling_frame, st.generation_frame, st.injection_frame, st.concentration_frame):
        with pytest.raises(StoredResultError, match="nested deeper than"):
            reader(f)
    f.write_text('{"points": "' + "[" * 100 + '"}')  # brackets inside a string are no nesting
    with pytest.raises(StoredResultError, match=r"points: a str, not a list"):
        st.scaling_frame(f)


def test_a_file_that_is_not_json_or_absent_is_refused_naming_it(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text('{"points": [')
    _refused(st.scaling_frame, f, "")
    _refused(st.injection_frame, tmp_path / "absent.json", "")


def test_a_bad_generation_row_is_refused(tmp_path):
    d = json.loads(GENERATION.read_text())
    bad = copy.deepcopy(d)
    bad["points"][0]["rows"]["eps=0.1"]["follows"]["lo"] = 0.6  # above its estimate 0.435
    _refused(st.generation_frame, _write(tmp_path, bad), "points[0].rows['eps=0.1'].follows.rate")
    bad = copy.deepcopy(d)
    bad["points"][0]["rows"]["Base"]["succ"]["rate"] = float("inf")
    _refused(st.generation_frame, _write(tmp_path, bad), "points[0].rows.Base.succ.rate")
    bad["points"][0]["rows"] = {}
    _refused(st.generation_frame, _write(tmp_path, bad), "points[0].rows")


def test_a_bad_injection_result_is_refused(tmp_path):
    d = json.loads(INJECTION.read_text())
    for mutate, field in ((lambda x: x["rows"]["0"]["steering"]["coincidence"].update(rate=1.0),
                           "rows['0'].steering.coincidence.rate"),
                          (lambda x: x["rows"]["20"]["controls"]["gain_over_backbone"].update(posterior=None),
                           "rows['20'].controls.gain_over_backbone.posterior"),
                          (lambda x: x["base"].update(pass1=float("nan")), "base.pass1"),
                          (lambda x: x.update(n_states=2.5), "n_states"),
                          (lambda x: x.update(machine="AMD EPYC"), "machine"),
                          (lambda x: x.update(rows={}), "rows"),
                          (lambda x: x["rows"].update(middle=x["rows"]["20"]), "rows.middle")):
        bad = copy.deepcopy(d)
        mutate(bad)
        _refused(st.injection_frame, _write(tmp_path, bad), field)


def test_a_bad_concentration_result_is_refused(tmp_path):
    ctl = {"follows": 0.1, "follows lo": 0.05, "follows hi": 0.2, "Base, random states": 0.07,
           "Base, random states lo": 0.03, "Base, random states hi": 0.2, "steps": 300}
    good = {"fitted_c": 4.2, "points": [{"c": 1.0, "controllability": {"eps=0.1": ctl},
                                         "pass@1": {"Base": 0.2, "eps=0.1": 0.3}, "samples": {"Base": 160, "eps=0.1": 160}}]}
    assert len(st.concentration_frame(_write(tmp_path, good)))
    for mutate, field in ((lambda x: x.update(fitted_c=float("inf")), "fitted_c"),
                          (lambda x: x["points"][0]["pass@1"].pop("eps=0.1"), "points[0]['pass@1']['eps=0.1']"),
                          (lambda x: x["points"][0]["controllability"]["eps=0.1"].update(follows=0.5),
                           "points[0].controllability['eps=0.1'].follows"),
                          (lambda x: x.update(points=[]), "points")):
        bad = copy.deepcopy(good)
        mutate(bad)
        _refused(st.concentration_frame, _write(tmp_path, bad), field)


# ---- the first page: the pilot and the GPU-hours ------------------------------------------------------

def test_a_bad_pilot_is_refused_naming_the_file_and_field(tmp_path):
    cfg = load_config("demo")
    d = json.loads(PILOT.read_text())
    for mutate, field in ((lambda x: x["levels"][1].update({"pass@1": float("nan")}), "levels[1]['pass@1']"),
                          (lambda x: x["levels"][1].update({"pass@1 95% CI": [0.5, 0.9]}), "levels[1]['pass@1']"),
                          (lambda x: x["levels"][0].update(icc=None), "levels[0].icc"),
                          (lambda x: x.update(levels=[]), "levels")):
        bad = copy.deepcopy(d)
        mutate(bad)
        _refused(lambda f: sc.pilot(cfg, f), _write(tmp_path, bad), field)


@pytest.mark.parametrize("mutate,field", [
    (lambda g: g["pairs_hours"][next(iter(g["pairs_hours"]))].update(mean=float("nan")), "estimate_graph.pairs_hours"),
    (lambda g: g["pairs_hours"][next(iter(g["pairs_hours"]))].update(cap=float("inf")), "estimate_graph.pairs_hours"),
    (lambda g: g["pairs_hours"][next(iter(g["pairs_hours"]))].update(mean=-1.0), "estimate_graph.pairs_hours"),
    (lambda g: g["pairs_hours"][next(iter(g["pairs_hours"]))].update(mean=9.0), "estimate_graph.pairs_hours"),  # above cap
    (lambda g: g.update(pairs_hours={}), "estimate_graph.pairs_hours"),  # was a StopIteration
    (lambda g: g.update(pairs_hours={"no separator": {"mean": 1, "cap": 2}}), "estimate_graph.pairs_hours"),
    (lambda g: g.pop("pairs_hours"), "estimate_graph.pairs_hours"),  # was a KeyError
])
def test_bad_gpu_hours_are_refused_on_the_first_page_and_the_pair_page(tmp_path, mutate, field):
    d = json.loads(GPU.read_text())
    mutate(d["estimate_graph"])
    f = _write(tmp_path, d)
    _refused(lambda p: fd.scale_finding(load_config("demo"), p), f, field)
    _refused(fd.pair_markdown, f, field)


def test_an_unreadable_gpu_result_is_refused_naming_it(tmp_path):
    f = tmp_path / "gpu.json"
    f.write_text("{\"environment\": ")
    _refused(lambda p: fd.scale_finding(load_config("demo"), p), f, "")
    d = json.loads(GPU.read_text())
    d["environment"] = "H200"
    _refused(fd.pair_markdown, _write(tmp_path, d), "environment")


def test_pair_markdown_reads_and_cites_the_file_it_is_given(tmp_path):
    d = json.loads(GPU.read_text())
    pair = next(iter(d["estimate_graph"]["pairs_hours"]))
    d["estimate_graph"]["pairs_hours"][pair] = {"mean": 11.11, "cap": 22.22}
    f = _write(tmp_path, d, "elsewhere.json")
    text = fd.pair_markdown(f)
    assert "| 11.1–22.2 |" in text and GPU.name not in text


# ---- where the stored results are read from -----------------------------------------------------------

def _copy_results(to: Path, scale: float | None = None) -> Path:
    for rel in COMMITTED:
        (to / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, to / rel)
    d = json.loads((to / "studies/results/steering_states.json").read_text())
    for p in d["points"]:
        p["chains"] = 7  # marks the copy
    (to / "studies/results/steering_states.json").write_text(json.dumps(d))
    g = json.loads((to / "bench/results/gpu_estimate_measured_nvidia_h200_qwen.json").read_text())
    g["estimate_graph"]["pairs_hours"][next(iter(g["estimate_graph"]["pairs_hours"]))] = {"mean": 11.11, "cap": 22.22}
    (to / "bench/results/gpu_estimate_measured_nvidia_h200_qwen.json").write_text(json.dumps(g))
    return to


def test_readers_take_a_root_and_the_environment_variable(tmp_path, monkeypatch):
    other = _copy_results(tmp_path / "elsewhere")
    monkeypatch.delenv(ENV, raising=False)
    assert st.states_result_path() == ROOT / "studies/results/steering_states.json"
    assert st.states_result_path(root=other) == other / "studies/results/steering_states.json"
    assert st.scaling_result_paths(root=other)[0].parent == other / "studies" / "results"
    assert st.injection_result_paths(root=tmp_path / "empty") == [] and st.generation_result_path(root=tmp_path) is None
    cfg = load_config("demo")
    monkeypatch.setenv(ENV, str(other))
    assert set(st.scaling_frame(st.states_result_path()).chains) == {7}
    assert st.fusion_result_path().parent == other / "studies" / "results"
    assert sc.pilot(cfg) is not None and "**11.1–22.2 H200-hours**" in fd.scale_finding(cfg)
    assert "| 11.1–22.2 |" in fd.pair_markdown()
    monkeypatch.setenv(ENV, str(tmp_path / "empty"))
    assert st.states_result_path() is None and sc.pilot(cfg) is None
    assert "have not been measured" in fd.scale_finding(cfg)


def _seeds_result(**kw) -> dict:
    return {**json.loads((ROOT / "studies/results/state_prompt_rl.json").read_text()), **kw}


def test_one_defect_is_refused_alike_by_every_page_that_reads_a_seeds_result(tmp_path):
    """The mechanism, stage-option, mask, adapter and RL pages share one reader: a kappa interval that misses its
    estimate in a seed is one refusal, the same on each page, naming the file and the field."""
    from ctrls.report import mechanism, steered_rl

    d = _seeds_result()
    d["seeds"][0]["kappa"]["kappa lo"] = d["seeds"][0]["kappa"]["kappa"] + 0.01
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    said = set()
    for page in (mechanism.seeds_frame, mechanism.stage_option_frame, mechanism.position_mask_frame,
                 mechanism.with_adapter_frame, steered_rl.rl_frame):
        with pytest.raises(StoredResultError) as e:
            page(p)
        said.add(str(e.value))
    assert len(said) == 1 and "r.json: " in said.pop()
    assert e.value.field == "seeds[0].kappa.kappa"


@pytest.mark.parametrize("claims, field, says", [
    ({"settings": {"state_prompt.with_adapter": "true"}}, "overrides", "state_prompt.with_adapter is not recorded"),
    ({"settings": {"against.state_prompt.use": "true"}}, "against", "missing"),
    ({"profile": "paper"}, "profile", "'demo', not the 'paper'"),
    ({"seed_fields": ("position_masks", "no_such_field")}, "seeds[0].no_such_field", "missing"),
])
def test_what_a_page_claims_of_the_runs_is_refused_naming_the_field(tmp_path, claims, field, says):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(_seeds_result()))
    with pytest.raises(StoredResultError, match=f"r.json: .*{says}") as e:
        read(p, "seeds", **claims)
    assert e.value.field == field
    read(p, "seeds", settings={"state_prompt.use": "true", "grid.position_floor": "0.05"}, profile="demo",
         seed_fields=("rl_table2",))  # what the file does hold reads


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["seeds"][0]["harm_fixed_minus_base_pass1"].update(non_inferior="false"),
     "seeds[0].harm_fixed_minus_base_pass1.non_inferior"),
    (lambda d: d["seeds"][0]["harm_fixed_minus_base_pass1"].update(lo=-0.2, non_inferior=True),
     "seeds[0].harm_fixed_minus_base_pass1.non_inferior"),  # 'yes' under a lower bound of -20 points
    (lambda d: d["seeds"].append(copy.deepcopy(d["seeds"][0])), "seeds[1].data_seed"),
    (lambda d: d["seeds"][0].update(questions=2.5), "seeds[0].questions"),
    (lambda d: d["seeds"][0]["position_masks"]["smollm2-135m-instruct__word_problems"].update(allowed=[[0, 0, 0, 0]] * 3),
     "seeds[0].position_masks['smollm2-135m-instruct__word_problems'].allowed[0]"),
    (lambda d: d["seeds"][0]["rl_table2"]["ε=0.0, H=0.0"]["minus_base"].update(p_holm=float("nan")),
     "seeds[0].rl_table2['ε=0.0, H=0.0'].minus_base.p_holm"),
])
def test_a_bad_seeds_result_is_refused_by_its_schema_naming_the_field(tmp_path, mutate, field):
    d = _seeds_result()
    mutate(d)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    with pytest.raises(StoredResultError, match="r.json: not a readable studies/seeds.py result: ") as e:
        read(p, "seeds")
    assert e.value.field == field


def test_a_state_prompt_result_with_zero_vectors_or_a_word_for_kappa_is_refused(tmp_path):
    d = json.loads((ROOT / "studies/results/state_prompt_seed1.json").read_text())
    for mutate, field in ((lambda x: x.update(vectors_per_state=0), "vectors_per_state"),
                          (lambda x: x["state_prompt"]["by_step"]["step 1"].update(kappa="high"),
                           "state_prompt.by_step['step 1'].kappa")):
        bad = copy.deepcopy(d)
        mutate(bad)
        (tmp_path / "sp.json").write_text(json.dumps(bad))
        with pytest.raises(StoredResultError) as e:
            read(tmp_path / "sp.json", "state_prompt")
        assert e.value.field == field
