"""``state_prompt.use``: the pretraining stage fits the vectors, the exploration stage decodes its CTRLS rows
under them (states drawn by the policy, read back without them), Base rows and the other stages' keys stay
as without the option, a damaged fit is refused by name, and RL trains under it."""
from __future__ import annotations

import shutil

import pytest
import torch

from ctrls.stages import progress as P
from tests.conftest import SMOKE_OVERRIDES, tiny_overrides

OPTION = ["state_prompt.use=true", "state_prompt.epochs=2"]


def _cfg(model_dir, run_dir, *extra):
    from ctrls.config.schema import load_config

    return load_config("smoke", [*SMOKE_OVERRIDES, *tiny_overrides(model_dir), f"run_dir={run_dir}", *extra])


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory, tiny_model_dir):
    from ctrls.stages.exploration import explore, load_samples
    from ctrls.stages.pretrain import pretrain

    d = tmp_path_factory.mktemp("state_prompt_runs")
    cfg = _cfg(tiny_model_dir, d, *OPTION)
    relay = d / "progress.json"  # the pretraining stage's bars, relayed as `ctrls reproduce` reads them
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(P.ENV, str(relay))
        mp.setattr(P, "EVERY_S", 0.0)
        run = pretrain(cfg.for_pair(*cfg.pairs()[0]), progress=True)
    run.relayed = P.read_state(relay)
    explore(cfg, progress=False)
    return cfg, run, load_samples(cfg)


def test_the_fit_relays_its_epochs_as_the_last_bar_of_pretraining(sp_run):
    _, run, _ = sp_run
    state = run.relayed
    assert (state["desc"], state["unit"], state["total"]) == ("(g) state prompt", "epoch", 2)
    assert state["n"] == run.summaries["state_prompt"]["epochs_run"] >= 1  # one step a finished epoch


def test_the_fit_is_a_pretraining_stage_with_vectors_per_state(sp_run):
    from safetensors import safe_open

    cfg, run, _ = sp_run
    s = run.summaries["state_prompt"]
    assert s["vectors_per_state"] == 2 and s["train_chains"] >= 1 and 0 <= s["kept_epoch"] <= 2
    assert s["heldout_logp_per_token"] >= s["initial_heldout_logp_per_token"]  # the kept epoch is the best held-out one
    with safe_open(str(run.root / "state_prompt" / "vectors.safetensors"), "pt") as f:
        v = f.get_tensor("vectors")
    assert v.shape[:2] == (s["n_states"], 2) and torch.isfinite(v).all()


def test_the_ctrls_rows_are_drawn_by_the_policy_and_read_back(sp_run, tiny_model_dir):
    """Every CTRLS sample has one drawn and one read-back state per step; the fixed row's are all s_0; the
    epsilon row's are the chain the policy draws from the question's seed (an independent redraw)."""
    from ctrls.config.settings import FIXED, row_label
    from ctrls.data.prompts import encode_prompt
    from ctrls.generate.controllability import draw_chains, encode_generations
    from ctrls.generate.sampling import seeded
    from ctrls.method.backbone import load_backbone
    from ctrls.method.streams import seed_of
    from ctrls.stages.common import problems_from_config
    from ctrls.stages.pretrain import load_pretrained

    cfg, _, df = sp_run
    ctrls_rows = df[df.config != "Base"]
    assert len(ctrls_rows) and set(ctrls_rows.finish) <= {"eos", "answer", "max_steps", "max_tokens"}
    for r in ctrls_rows.itertuples():
        assert len(r.states) == len(r.encoded) == len(r.steps) <= cfg.prompt.max_steps
    fixed = df[df.config == FIXED]
    assert all(set(r.states) <= {r.s0} for r in fixed.itertuples())
    pc = cfg.for_pair(*cfg.pairs()[0])
    bb = load_backbone(str(tiny_model_dir), "cpu", "float32")
    model = load_pretrained(pc, bb)
    eps = cfg.grid.epsilons[0]
    label = row_label(eps)
    for p in problems_from_config(pc, "test"):
        ids, start = encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot)
        s0, _ = encode_generations(bb, model, ids, start, [])
        for eta in cfg.grid.temperatures:
            seed = seed_of(cfg.seed, pc.backbone.name, pc.data.dataset, eta, label, p.id)
            want = draw_chains(model.policy, s0, [cfg.prompt.max_steps] * cfg.grid.n_samples, eps, generator=seeded(seed))
            got = df[(df.config == label) & (df.question_id == p.id) & (df.temperature == eta)].sort_values("sample_index")
            assert len(got) == cfg.grid.n_samples
            for m, r in enumerate(got.itertuples()):
                assert list(r.states) == want[m][:len(r.states)] and r.s0 == int(s0.argmax())


def test_base_rows_and_the_other_stages_are_those_of_a_run_without_the_option(sp_run, tiny_runs):
    from ctrls.stages.exploration import _stage, load_samples
    from ctrls.stages.pretrain import pretrain_stages

    cfg, _, df = sp_run
    _, off_cfg, _ = tiny_runs
    off = load_samples(off_cfg)
    key = ["temperature", "question_id", "sample_index"]
    a = df[df.config == "Base"].sort_values(key)
    b = off[off.config == "Base"].sort_values(key)
    assert a.text.tolist() == b.text.tolist() and [list(x) for x in a.encoded] == [list(x) for x in b.encoded]
    on, no = pretrain_stages(cfg.for_pair(*cfg.pairs()[0])), pretrain_stages(off_cfg.for_pair(*off_cfg.pairs()[0]))
    assert "state_prompt" not in no and {n: s.key for n, s in no.items()} == {n: on[n].key for n in no}
    eps = df[df.config != "Base"].sort_values(key)
    eps_off = off[off.config != "Base"].sort_values(key)
    assert eps.text.tolist() != eps_off.text.tolist()  # the CTRLS rows are the state prompt's, not the adapter's
    from ctrls.config.schema import override

    assert _stage(override(off_cfg, {"state_prompt.vectors": 5})).key == _stage(off_cfg).key  # off: the section is not read
    assert _stage(override(cfg, {"state_prompt.vectors": 5})).key != _stage(cfg).key


def test_a_damaged_fit_is_refused_by_name(sp_run, tmp_path):
    from ctrls.method.backbone import load_backbone
    from ctrls.stages.pretrain import PretrainError, pretrain_stages
    from ctrls.stages.runs import ArtifactError
    from ctrls.stages.state_prompt import load_state_prompt

    cfg, run, _ = sp_run
    copy = tmp_path / "runs"
    shutil.copytree(cfg.run_dir, copy)
    from ctrls.config.schema import override

    c = override(cfg, {"run_dir": str(copy)}).for_pair(*cfg.pairs()[0])
    bb = load_backbone(cfg.backbone.name, "cpu", "float32")
    K = run.summaries["state_prompt"]["n_states"]
    assert load_state_prompt(pretrain_stages(c)["state_prompt"], bb, K, 2).vectors.shape[0] == K
    with pytest.raises(ArtifactError, match="vectors.safetensors"):
        load_state_prompt(pretrain_stages(c)["state_prompt"], bb, K + 1, 2)  # vectors for another K
    path = next(copy.rglob("vectors.safetensors"))
    path.write_bytes(b"not a safetensors file")
    with pytest.raises((PretrainError, ArtifactError), match="state_prompt"):
        load_state_prompt(pretrain_stages(c)["state_prompt"], bb, K, 2)


def test_rl_trains_under_the_state_prompt_and_its_mask(sp_run, tmp_path, monkeypatch):
    """With the option and a position mask the RL stage's CTRLS rollouts are the state prompt's: each
    trajectory's actions are the chain its policy draws from the question's seed (an independent redraw),
    renormalised over the mask's states (log a = -inf elsewhere, ``allowed`` the mask's rows), every step
    decoded under the drawn action's state; the policies train and Table 2's rows keep to the mask. The
    stage's key holds the option's section, and not without it."""
    from ctrls.config.schema import override
    from ctrls.generate.controllability import draw_actions
    from ctrls.generate.sampling import seeded
    from ctrls.stages import state_prompt as sps
    from ctrls.stages.pretrain import pretrain_stages
    from ctrls.stages.rl import load_curves, load_table2_samples, profile_markdown, rl_stage, run_rl

    cfg, _, _ = sp_run
    copy = tmp_path / "runs"
    shutil.copytree(cfg.run_dir, copy)
    c = override(cfg, {"run_dir": str(copy), "grid.position_floor": 0.5, "grid.position_buckets": 2, "rl.steps": 1})
    pc = c.for_pair(*c.pairs()[0])
    import ctrls.generate.sampling as sampling
    from ctrls.generate.conditioning import StatePromptConditioning

    real, seen, passes, distinct = sampling.sample, [], set(), set()

    def spy(bb, prompts, n=1, params=None, **kw):
        out = real(bb, prompts, n, params, **kw)
        cond = kw.get("conditioning")
        if not isinstance(cond, StatePromptConditioning):
            return out
        passes.add(cond.passes)
        distinct.update(tuple(p) for p in prompts)
        for i, gs in enumerate(out):  # redrawn now: the policy moves after this step's update
            ids = kw["sample_ids"][i]
            acts, logs = draw_actions(kw["policies"][i], gs[0].policy_states[0], max(ids) + 1, params.max_steps,
                                      kw["epsilons"][i], generator=seeded(kw["seeds"][i]), mask=cond.mask)
            seen.extend((g, acts[g.sample_index], logs[g.sample_index], cond.mask) for g in gs)
        return out

    monkeypatch.setattr(sampling, "sample", spy)
    run_rl(c, progress=False)
    (shared,) = passes  # every rollout, evaluation and table row shares the prompts' s_0 passes
    assert shared.passes == len(distinct) and not shared.caches  # each prompt run once; no read-back, no cache kept
    assert seen and any(len(g.policy_states) > 1 and not g.allowed.all() for g, *_ in seen)  # a masked draw
    for g, acts, logs, mask in seen:
        D = len(g.policy_states) - 1
        assert D >= len(g.steps) and torch.allclose(g.policy_states[1:], acts[:D].float())
        assert torch.equal(g.log_actions, logs[:D]) and torch.equal(
            g.allowed, torch.stack([mask.allowed[mask.bucket(t)] for t in range(D)]))
        assert torch.isinf(g.log_actions[~g.allowed]).all() and torch.isfinite(g.log_actions[g.allowed]).all()
        assert g.states[1:].argmax(-1).tolist() == acts[:len(g.steps)].argmax(-1).tolist()  # decoded under a_t's state
    curves = load_curves(c)
    assert len(curves) and curves.step.max() == 1
    m = sps.position_mask_for(pc, pretrain_stages(pc)["states"].dir, int(seen[0][0].states.shape[1]))
    t2 = load_table2_samples(c)
    rows = t2[t2.config != "Base"]
    assert len(rows) and all(all(bool(m.allowed[m.bucket(t), s]) for t, s in enumerate(r.states)) for r in rows.itertuples())
    assert "under the state prompt" in profile_markdown(c) and "through the adapter" not in profile_markdown(c)
    assert rl_stage(override(c, {"state_prompt.vectors": 3})).key != rl_stage(c).key
    off = override(c, {"state_prompt.use": False, "grid.position_floor": 0.0})
    assert rl_stage(override(off, {"state_prompt.vectors": 3})).key == rl_stage(off).key


def test_the_position_mask_restricts_every_drawn_state_and_the_null(sp_run, tmp_path):
    """``grid.position_floor`` > 0: the CTRLS rows' drawn states and Base's null chains are allowed at their
    step, the fixed row is ``PositionMask.fixed(s0)``; the mask is the one of the training chains, recorded
    in the stage's done record; pretraining is not redone (its keys do not hold the grid)."""
    from ctrls.config.schema import override
    from ctrls.config.settings import FIXED
    from ctrls.stages.exploration import _stage, explore, load_samples
    from ctrls.stages.pretrain import pretrain_stages
    from ctrls.stages.state_prompt import position_mask_for

    cfg, _, _ = sp_run
    copy = tmp_path / "runs"
    shutil.copytree(cfg.run_dir, copy)
    c = override(cfg, {"run_dir": str(copy), "grid.position_floor": 0.5, "grid.position_buckets": 2})
    keys = {n: s.key for n, s in pretrain_stages(c.for_pair(*c.pairs()[0])).items()}
    explore(c, progress=False)
    assert {n: s.key for n, s in pretrain_stages(c.for_pair(*c.pairs()[0])).items()} == keys
    df = load_samples(c)
    K = int(df.n_states.iloc[0])
    pc = c.for_pair(*c.pairs()[0])
    m = position_mask_for(pc, pretrain_stages(pc)["states"].dir, K)
    assert not m.allowed.all()  # the test needs a state that is masked somewhere
    rec = _stage(c).summary()["position_masks"]
    assert list(rec.values())[0]["allowed"] == m.allowed.int().tolist()
    ok = lambda chain: all(bool(m.allowed[m.bucket(t), s]) for t, s in enumerate(chain))  # noqa: E731
    ctrls_rows = df[df.config != "Base"]
    assert len(ctrls_rows) and all(ok(r.states) for r in ctrls_rows.itertuples())
    base = df[df.config == "Base"]
    assert all(ok(ch) for r in base.itertuples() for ch in r.chains)
    for r in df[df.config == FIXED].itertuples():
        assert list(r.states) == m.fixed(r.s0, len(r.states))


def test_the_position_mask_is_refused_without_the_state_prompt(tiny_model_dir, tmp_path):
    from ctrls.errors import ConfigError

    with pytest.raises(ConfigError, match="grid.position_floor"):
        _cfg(tiny_model_dir, tmp_path, "grid.position_floor=0.1")
    _cfg(tiny_model_dir, tmp_path, "grid.position_floor=0.1", *OPTION)


def test_with_the_adapter_the_fit_and_the_decode_go_through_it(sp_run, tmp_path, monkeypatch):
    """``state_prompt.with_adapter``: only the state prompt's stage is redone (it reads the adapter's), its
    vectors are fitted through the frozen adapter and the CTRLS rows decoded with it; refused without the option."""
    from ctrls.config.schema import override
    from ctrls.errors import ConfigError
    from ctrls.stages import state_prompt as stage
    from ctrls.stages.exploration import explore
    from ctrls.stages.pretrain import pretrain, pretrain_stages

    cfg, _, _ = sp_run
    copy = tmp_path / "runs"
    shutil.copytree(cfg.run_dir, copy)
    c = override(cfg, {"run_dir": str(copy), "state_prompt.with_adapter": True})
    pc, before = c.for_pair(*c.pairs()[0]), pretrain_stages(cfg.for_pair(*cfg.pairs()[0]))
    after = pretrain_stages(pc)
    assert {n for n in after if after[n].key != before[n].key} == {"state_prompt"}
    heads = []
    real_fit = stage.fit
    monkeypatch.setattr(stage, "fit", lambda *a, **k: heads.append(("fit", k.get("head"))) or real_fit(*a, **k))
    real_cond = stage.ctrls_conditioning

    def conditioning(*a, **k):
        cond = real_cond(*a, **k)
        heads.append(("decode", cond.head))
        return cond

    monkeypatch.setattr(stage, "ctrls_conditioning", conditioning)
    import ctrls.stages.exploration as exploration

    monkeypatch.setattr(exploration, "ctrls_conditioning", conditioning)
    run = pretrain(pc, progress=False)
    assert run.summaries["state_prompt"]["with_adapter"] is True
    explore(c, progress=False)
    assert {n for n, h in heads if h is not None} == {"fit", "decode"}
    assert all(h is not None for _, h in heads)
    with pytest.raises(ConfigError, match="state_prompt.with_adapter"):
        _cfg(tmp_path, tmp_path, "state_prompt.with_adapter=true")


def test_the_paper_cases_are_decoded_as_the_exploration_rows_are(sp_run, monkeypatch):
    """Under the option the case studies' CTRLS samples are the state prompt's (one drawn state per step,
    the policy's chain), and Base's are the engine's, as in the exploration rows."""
    from ctrls.data.problems import Problem
    from ctrls.stages import cases

    cfg, _, _ = sp_run
    import ctrls.generate.sampling as sampling
    from ctrls.generate.conditioning import StatePromptConditioning

    calls = []
    real = sampling.sample

    def spy(bb, prompts, *a, **kw):
        if isinstance(kw.get("conditioning"), StatePromptConditioning):
            calls.append(len(prompts))
        return real(bb, prompts, *a, **kw)

    monkeypatch.setattr(sampling, "sample", spy)  # the case-study stage imports the engine when it decodes
    found = {"two": Problem(id="c0", question="Tom has 3 apples and buys 4 more. How many apples?", answer="7",
                             steps=("3 + 4 = 7",), source="math", split="test")}
    df = cases.sample_paper_cases(cfg, n=2, cases=found)
    assert calls == [1]  # one prompt, decoded under the vectors; Base went through the engine
    eps = df[df.config != "Base"]
    assert len(eps) == 2 and len(df[df.config == "Base"]) == 2
    assert all(len(st) >= len(s) for st, s in zip(eps.states, eps.steps))  # a drawn state for every step


def _decoding(sp_run, model_dir, n_questions: int):
    """The run's pair config, the tiny backbone, the pretrained model, its state prompt and mask, and the
    prompts of its first ``n_questions`` test questions."""
    from ctrls.data.prompts import encode_prompt
    from ctrls.method.backbone import load_backbone
    from ctrls.stages.common import problems_from_config
    from ctrls.stages.pretrain import load_pretrained, pretrain_stages
    from ctrls.stages.state_prompt import pair_state_prompt

    cfg, _, _ = sp_run
    pc = cfg.for_pair(*cfg.pairs()[0])
    bb = load_backbone(str(model_dir), "cpu", "float32")
    model = load_pretrained(pc, bb)
    sp, mask = pair_state_prompt(pc, bb, model, pretrain_stages(pc))
    probs = problems_from_config(pc, "test")[:n_questions]
    enc = [encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot) for p in probs]
    return pc, bb, model, sp, mask, enc


def sample_state_prompt(bb, model, sp, prompts, n, params, seeds, mask=None, passes=None):
    """The engine under the state prompt, read back, as the exploration stage decodes its CTRLS rows."""
    from ctrls.generate.conditioning import StatePromptConditioning
    from ctrls.generate.sampling import sample

    cond = StatePromptConditioning(model, sp, mask=mask, passes=passes)
    return sample(bb, [p for p, _ in prompts], n, params, seeds=list(seeds), prompt_starts=[st for _, st in prompts],
                  conditioning=cond, read_states=model)


def test_shared_prompt_passes_give_the_samples_of_fresh_ones(sp_run, tiny_model_dir):
    """Rows that share their prompts' passes (``PromptPasses``: the exploration stage's ε then fixed rows, the RL
    runs) draw and decode the samples, and read back the states, of calls that run every pass themselves,
    with each distinct prompt's pass run once: s_0 before decoding, the read-back on the kept KV cache."""
    from ctrls.generate.controllability import PromptPasses
    from ctrls.stages.common import sample_params

    pc, bb, model, sp, mask, enc = _decoding(sp_run, tiny_model_dir, 2)
    prompts = enc + enc[:1]  # a prompt twice in one call
    shared, rows = PromptPasses(keep=len(prompts)), []
    for transitions, eps in ((True, 0.3), (False, 0.0)):  # the ε row, then the fixed-s0 row
        params = sample_params(pc, 0.7, epsilon=eps, transitions=transitions)
        alone = sample_state_prompt(bb, model, sp, prompts, 2, params, [5, 6, 7], mask=mask)
        with_shared = sample_state_prompt(bb, model, sp, prompts, 2, params, [5, 6, 7], mask=mask, passes=shared)
        rows.append((alone, with_shared))
    assert shared.passes == len(enc)  # one pass per distinct prompt for both rows and both read-backs
    for alone, with_shared in rows:
        for a, b in zip(sum(alone, []), sum(with_shared, [])):
            assert a.token_ids == b.token_ids and torch.equal(a.states, b.states)
            assert a.encoded == b.encoded and torch.equal(a.encoded_s0, b.encoded_s0)
    assert sum(len(g.encoded) for gs in rows[0][0] for g in gs) > 2  # read-backs with steps to compare


def test_the_state_prompt_decodes_at_most_batch_size_rows_together(sp_run, tiny_model_dir, monkeypatch):
    """``sampling.batch_size`` bounds the rows decoded together (the RL stage's lockstep table rows are
    several hundred): prompts whole, in order, every sample returned under its prompt and index."""
    from dataclasses import replace

    import ctrls.generate.sampling as sampling
    from ctrls.stages.common import sample_params

    pc, bb, model, sp, mask, prompts = _decoding(sp_run, tiny_model_dir, 3)
    real, batches = sampling._decode, []

    def spy(bb, ps, starts, ids, *a, **kw):
        batches.append([tuple(p) for p, m in zip(ps, ids) for _ in m])
        return real(bb, ps, starts, ids, *a, **kw)

    monkeypatch.setattr(sampling, "_decode", spy)
    params = replace(sample_params(pc, 0.7, epsilon=0.1, transitions=True), batch_size=5)
    out = sample_state_prompt(bb, model, sp, prompts, 2, params, [1, 2, 3], mask=mask)
    assert [len(b) for b in batches] == [4, 2]  # 2 + 2 rows, then the third prompt's 2 (5 would split it)
    assert sum(batches, []) == [tuple(p) for p, _ in prompts for _ in range(2)]
    assert [[(g.prompt_index, g.sample_index) for g in gs] for gs in out] == [[(i, 0), (i, 1)] for i in range(3)]


def test_held_rows_keep_their_state_at_every_step(sp_run, tiny_model_dir):
    """hold=j decodes every step under state j (a prompt whose s_0 is j decodes the fixed row's samples, the
    same seeds); hold="s0" keeps s_0 where the position mask would substitute; a state outside [0, K) is refused."""
    import pytest

    from ctrls.method.positions import PositionMask
    from ctrls.stages.common import sample_params

    pc, bb, model, sp, _, enc = _decoding(sp_run, tiny_model_dir, 2)
    K = sp.n_states
    fixed = sample_state_prompt(bb, model, sp, enc, 2, sample_params(pc, 0.7, transitions=False), [5, 6])
    for i, gs in enumerate(fixed):
        s0 = int(gs[0].states[0].argmax())
        for j in range(K):
            held = sample_state_prompt(bb, model, sp, [enc[i]], 2, sample_params(pc, 0.7, transitions=False, hold=j), [5 + i])
            for a, b in zip(gs, held[0]):
                assert b.states[1:].argmax(-1).tolist() == [j] * (len(b.states) - 1)
                if j == s0:  # the fixed row is the held row of its own s_0
                    assert a.token_ids == b.token_ids
    s0 = int(fixed[0][0].states[0].argmax())
    allowed = torch.ones(3, K, dtype=torch.bool)
    allowed[:, s0] = False  # s_0 can occur nowhere: the fixed row substitutes the mode, "hold s0" does not
    counts = torch.zeros(3, K, dtype=torch.long)
    counts[:, (s0 + 1) % K] = 1  # each position's most frequent state, the one the fixed row substitutes
    mask = PositionMask(allowed=allowed, counts=counts)
    sub = sample_state_prompt(bb, model, sp, enc[:1], 1, sample_params(pc, 0.7, transitions=False), [5], mask=mask)
    hold = sample_state_prompt(bb, model, sp, enc[:1], 1, sample_params(pc, 0.7, transitions=False, hold="s0"), [5], mask=mask)
    assert set(sub[0][0].states[1:].argmax(-1).tolist()) == {(s0 + 1) % K}
    assert set(hold[0][0].states[1:].argmax(-1).tolist()) == {s0}
    with pytest.raises(ValueError, match=f"hold={K}"):
        sample_state_prompt(bb, model, sp, enc[:1], 1, sample_params(pc, 0.7, transitions=False, hold=K), [5])



def test_the_grid_holds_every_constant_state_and_s0(sp_run, tmp_path):
    """grid.hold_state and grid.constant_states add the "hold s0" row and one "state j" row per state, each
    step of each sample under its held state; pretraining is reused (its keys do not hold the grid)."""
    from ctrls.config.schema import override
    from ctrls.config.settings import HOLD, constant_label
    from ctrls.stages.exploration import explore, load_samples

    cfg, _, _ = sp_run
    copy = tmp_path / "runs"
    shutil.copytree(cfg.run_dir, copy)
    c = override(cfg, {"run_dir": str(copy), "grid.hold_state": True, "grid.constant_states": True})
    explore(c, progress=False)
    df = load_samples(c)
    K = int(df.n_states.iloc[0])
    assert {HOLD, *(constant_label(j) for j in range(K))} <= set(df.config)
    for r in df[df.config == HOLD].itertuples():
        assert set(r.states) <= {r.s0}
    for j in range(K):
        rows = df[df.config == constant_label(j)]
        assert len(rows) and all(set(r.states) <= {j} and len(r.states) == len(r.steps) for r in rows.itertuples())


def test_the_state_prompts_decode_checks_its_inputs_as_the_engine_does(sp_run, tiny_model_dir, monkeypatch):
    """An empty prompt, an s_0 start outside the prompt, a seed count that is not the prompts', and a prompt that
    with max_new_tokens and the T x m vectors runs past the model's positions are refused before decoding."""
    import pytest

    from ctrls.data.prompts import PromptError
    from ctrls.stages.common import sample_params

    pc, bb, model, sp, _, enc = _decoding(sp_run, tiny_model_dir, 1)
    params = sample_params(pc, 0.7, transitions=False)
    ids, start = enc[0]
    with pytest.raises(PromptError, match="empty"):
        sample_state_prompt(bb, model, sp, [([], 0)], 1, params, [1])
    with pytest.raises(ValueError, match="is not among its"):
        sample_state_prompt(bb, model, sp, [(ids, len(ids))], 1, params, [1])
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        sample_state_prompt(bb, model, sp, [(ids, start)], 1, params, [1, 2])
    room = len(ids) + params.max_new_tokens + params.max_steps * sp.vectors.shape[1]
    monkeypatch.setattr(bb.model.config, "max_position_embeddings", room - 1)
    with pytest.raises(PromptError, match="state prompt's vectors"):
        sample_state_prompt(bb, model, sp, [(ids, start)], 1, params, [1])
    monkeypatch.setattr(bb.model.config, "max_position_embeddings", room)
    assert len(sample_state_prompt(bb, model, sp, [(ids, start)], 1, params, [1])[0]) == 1  # exactly enough fits
