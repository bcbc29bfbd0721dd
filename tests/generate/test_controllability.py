"""Controllability and diversity (ctrls.generate.controllability): known answers for every metric, and the
re-encoding of generated steps against an independent, one-sequence-at-a-time reference."""
import math

import numpy as np
import pytest
import torch

from ctrls.generate import controllability as ctl
from ctrls.generate.sampling import seeded
from ctrls.method.model import CTRLSConfig, CTRLSModel
from ctrls.method.policy import TransitionPolicy


def _model(centroids: torch.Tensor, hidden_size: int, k: int, L: torch.Tensor | None = None, c: float = 5.0,
           tau: float = 1.0) -> CTRLSModel:
    K = centroids.shape[0]
    conf = CTRLSConfig(hidden_size=hidden_size, n_states=K, requested_states=K, spectral_k=k, spectral_normalize=True,
                       tau=tau, rank=4)
    return CTRLSModel.build(conf, centroids, concentration=c, L=L if L is not None else torch.zeros(K, K))


def _oracle_centroids(K: int, d: int, seed: int = 0) -> torch.Tensor:
    """K centroids in R^d whose largest-magnitude entry is positive: a one-token step whose hidden
    state is centroid j has spectral embedding (k = 1) exactly centroid j."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(K, d, generator=g)
    peak = c.gather(1, c.abs().argmax(1, keepdim=True))
    return torch.where(peak < 0, -c, c)


def test_an_oracle_generator_is_fully_controllable():
    """The 'generator' emits, for each sampled state, a step whose embedding is exactly that state's
    centroid: Q_phi (spectral embedding -> soft assignment -> argmax) gives every state back, and
    the match rate is 1 (with a Wilson interval). Steps built from a chain drawn from the policy."""
    K, d, n_q, n_s = 6, 12, 15, 4
    cents = _oracle_centroids(K, d)
    model = _model(cents, d, k=1, L=torch.randn(K, K, generator=torch.Generator().manual_seed(1)))
    drawn, encoded_feat, encoded_hidden, qs = [], [], [], []
    for q in range(n_q):
        s0 = torch.softmax(torch.randn(K, generator=torch.Generator().manual_seed(100 + q)), -1)
        for chain in ctl.draw_chains(model.policy, s0, [5, 3, 7, 1][:n_s], 0.3, generator=seeded(q)):
            drawn += chain
            qs += [q] * len(chain)
            idx = torch.as_tensor(chain)
            encoded_feat += model.assign(cents[idx]).argmax(-1).tolist()  # features constructed directly
            steps = [cents[j][None] for j in chain]  # one-token steps E_t = gamma_j, through Eq. 5
            encoded_hidden += model.assign(model.embed(steps)).argmax(-1).tolist()
    assert len(set(drawn)) > 2  # the chains visit several states
    for enc in (encoded_feat, encoded_hidden):
        r = ctl.match_rate(np.array(drawn), np.array(enc), qs, n_boot=200)
        # rate 1 with a Wilson interval that does not collapse: at p = 1 the effective size falls back
        # to the number of questions, lo = n_q / (n_q + z^2)
        assert (r["rate"], r["hi"]) == (1.0, 1.0) and r["lo"] == pytest.approx(n_q / (n_q + 1.959964 ** 2))
        assert r["steps"] == len(drawn) and r["questions"] == n_q
    # and an oracle that emits the *next* state's centroid is not
    shifted = [(s + 1) % K for s in drawn]
    assert ctl.match_rate(np.array(drawn), np.array(shifted), qs, n_boot=50)["rate"] == 0.0


def test_independent_states_match_at_chance():
    """Steps whose states are independent of the drawn ones match at 1/K, within Monte-Carlo error,
    and the bootstrap interval has the binomial width (steps of different questions are independent here)."""
    K, n_q, T = 8, 300, 40
    rng = np.random.default_rng(0)
    drawn = rng.integers(0, K, size=n_q * T)
    encoded = rng.integers(0, K, size=n_q * T)
    qs = np.repeat(np.arange(n_q), T)
    r = ctl.match_rate(drawn, encoded, qs, n_boot=500)
    se = math.sqrt((1 / K) * (1 - 1 / K) / len(drawn))
    assert abs(r["rate"] - 1 / K) < 4 * se
    assert r["lo"] <= r["rate"] <= r["hi"]
    assert (r["hi"] - r["lo"]) / (2 * 1.96 * se) == pytest.approx(1.0, abs=0.2)


def test_match_rate_is_step_weighted_with_known_values():
    # question a: 3 of 4 steps match; question b: 0 of 1; question c: 1 of 1 -> 4 / 6
    target = np.array([0, 1, 2, 3, 1, 2])
    encoded = np.array([0, 1, 2, 0, 0, 2])
    qs = ["a", "a", "a", "a", "b", "c"]
    r = ctl.match_rate(target, encoded, qs, n_boot=300)
    assert r["rate"] == pytest.approx(4 / 6) and r["questions"] == 3 and r["steps"] == 6
    assert 0.0 <= r["lo"] <= r["rate"] <= r["hi"] <= 1.0
    with pytest.raises(ValueError, match="one length"):
        ctl.match_rate(target, encoded[:-1], qs)


def test_match_rate_difference_pairs_questions_by_name():
    qa = ["q1", "q1", "q2", "q3"]
    a = (np.array([1, 2, 3, 4]), np.array([1, 2, 3, 4]), qa)  # all match
    # the same questions in another order, none matching
    b = (np.array([0, 0, 0, 0, 0]), np.array([1, 1, 1, 1, 1]), ["q3", "q2", "q2", "q1", "q1"])
    d = ctl.match_rate_difference(a, b, n_boot=300)
    # Newcombe's paired interval does not collapse at 100% vs 0%, and 3 questions prove little: the
    # permutation p-value is about 2/8 (only "swap none" and "swap all" reach |T| = 1), never 0
    assert d["diff"] == 1.0 and d["hi"] == 1.0 and 0 < d["lo"] < 0.9
    assert d["p_value"] == pytest.approx(0.25, abs=0.06)
    # a paired bootstrap: per-question rates that move together give a narrower interval than unpaired
    rng = np.random.default_rng(1)
    qs = np.repeat(np.arange(60), 10)
    level = np.repeat(rng.uniform(0.1, 0.9, 60), 10)  # a per-question match probability, shared
    hit_a, hit_b = rng.uniform(size=600) < level + 0.05, rng.uniform(size=600) < level
    t = np.zeros(600, dtype=int)
    d = ctl.match_rate_difference((t, (~hit_a).astype(int), qs), (t, (~hit_b).astype(int), qs), n_boot=1000)
    ra = ctl.match_rate(t, (~hit_a).astype(int), qs, n_boot=1000)
    rb = ctl.match_rate(t, (~hit_b).astype(int), qs, n_boot=1000)
    assert d["diff"] == pytest.approx(ra["rate"] - rb["rate"])
    assert d["hi"] - d["lo"] < 0.8 * math.hypot(ra["hi"] - ra["lo"], rb["hi"] - rb["lo"])
    with pytest.raises(ValueError, match="same questions"):
        ctl.match_rate_difference(a, (np.array([0]), np.array([0]), ["q9"]))


def test_diversity_on_hand_made_answers_and_states():
    answers = [["1", "1", "2", None], ["3", "3", "3", "3"], [None, None], ["4", "5", "6", "7"]]
    assert ctl.distinct_answers(answers).tolist() == [2, 1, 0, 4]
    seqs = [[[0, 0], [1, 1]],  # states 0, 0, 1, 1: 1 bit
            [[2, 2, 2]],  # one state: 0 bits
            [[0, 1], [2, 3]],  # four states once each: 2 bits
            [[], []]]  # no steps: 0
    assert ctl.state_entropy(seqs).tolist() == pytest.approx([1.0, 0.0, 2.0, 0.0])
    assert ctl.entropy_bits([0, 0, 0, 1]) == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    m, lo, hi = ctl.mean_with_ci(ctl.distinct_answers(answers), n_boot=200)
    assert m == pytest.approx(7 / 4) and lo <= m <= hi


def test_draw_chains_follow_a_known_chain():
    """A sharp permutation chain (L = 30 on j -> j+1 mod K, large c) is followed step by step from a
    one-hot s_0; with epsilon = 1 the states are uniform (chi-square); a seeded generator repeats."""
    K = 5
    L = torch.full((K, K), -30.0)
    L[torch.arange(K), (torch.arange(K) + 1) % K] = 30.0
    pol = TransitionPolicy(K, concentration=1e4)
    with torch.no_grad():
        pol.L.copy_(L)
    s0 = torch.eye(K)[2]
    chains = ctl.draw_chains(pol, s0, [6, 0, 3], 0.0, generator=seeded(0))
    assert chains == [[3, 4, 0, 1, 2, 3], [], [3, 4, 0]]
    flat = [s for c in ctl.draw_chains(pol, s0, [20] * 250, 1.0, generator=seeded(1)) for s in c]
    freq = np.bincount(flat, minlength=K)
    expect = len(flat) / K
    assert ((freq - expect) ** 2 / expect).sum() < 18.5  # 4 degrees of freedom: P(chi2 > 18.5) < 1e-3
    assert ctl.draw_chains(pol, s0, [4, 4], 0.5, generator=seeded(3)) == \
        ctl.draw_chains(pol, s0, [4, 4], 0.5, generator=seeded(3))


# ---- re-encoding generated steps ----------------------------------------------------------------------


class _Gen:
    def __init__(self, token_ids, spans):
        self.token_ids, self.spans = token_ids, spans


def _reference(bb, model, prompt, start, gens, layer):
    """One sequence at a time, as pretraining's feature stage does: a full forward of prompt +
    solution (``Backbone.hidden_states``), step t = positions P+a .. P+b-1, kept at float16."""
    P = len(prompt)
    s0 = None
    states = []
    for g in gens:
        h = bb.hidden_states(torch.tensor([prompt + g.token_ids]), layer=layer)[0].float()
        s0 = model.encode([h[start:P]])[0]
        steps = [h[P + a:P + b].to(torch.float16).float() for a, b in g.spans]
        states.append(model.assign(model.embed(steps)).argmax(-1).tolist() if steps else [])
    return s0, states


@pytest.mark.parametrize("layer", [-1, 1])
def test_encode_generations_equals_one_sequence_at_a_time(tiny_llama, layer):
    """The batched re-encoding (prompt once, its KV cache shared, generations right-padded) gives the
    states of the unbatched full-forward path, for the last layer and an inner one."""
    from ctrls.method.states import fit_states

    bb = tiny_llama
    tok = bb.tokenizer
    prompt = tok("Tom has 3 apples and buys 4 more. How many apples?")["input_ids"]
    start = 3
    rng = np.random.default_rng(0)
    gens = []
    for n in (23, 9, 0, 31, 15):
        ids = rng.integers(100, 5000, size=n).tolist()
        cuts = sorted(set(rng.integers(1, n, size=3).tolist())) if n > 4 else []
        edges = [0, *cuts, n] if n else []
        gens.append(_Gen(ids, [(a, b) for a, b in zip(edges, edges[1:])]))
    d, k = bb.hidden_size, 2
    # centroids fitted on the steps themselves, so that the steps spread over several states
    probe = _model(torch.zeros(4, k * d), d, k)
    hs = [bb.hidden_states(torch.tensor([prompt + g.token_ids]), layer=layer)[0].float() for g in gens if g.token_ids]
    emb = probe.embed([h[len(prompt) + a:len(prompt) + b] for h, g in zip(hs, [g for g in gens if g.token_ids])
                       for a, b in g.spans])
    model = _model(fit_states(emb, 4, seed=0).centroids, d, k)
    s0, states = ctl.encode_generations(bb, model, prompt, start, gens, layer=layer)
    ref_s0, ref_states = _reference(bb, model, prompt, start, gens, layer)
    assert [len(s) for s in states] == [len(g.spans) for g in gens] and states[2] == []
    assert states == ref_states
    assert len({s for st in states for s in st}) > 1
    assert torch.allclose(s0, ref_s0.float().cpu(), atol=1e-5)
    # the test can tell: the state of step t comes from its own tokens, not the previous step's
    assert states != [[st[0], *st[:-1]] if st else [] for st in states]


def test_prompt_passes_run_a_prompt_once_with_the_same_states(tiny_llama):
    """``PromptPasses``: s_0 and the read-back of a prompt's generations equal those of a fresh pass, and the
    prompt is run once while its KV cache is kept; past ``keep`` prompts the oldest is run again."""
    from ctrls.method.states import fit_states

    bb = tiny_llama
    tok = bb.tokenizer
    prompts = [tok(q)["input_ids"] for q in ("Tom has 3 apples. How many?", "Ann has 5 pears and eats 2. How many?")]
    rng = np.random.default_rng(1)
    gens = [_Gen(rng.integers(100, 5000, size=n).tolist(), [(0, 4), (4, n)]) for n in (9, 13)]
    d, k = bb.hidden_size, 2
    probe = _model(torch.zeros(4, k * d), d, k)
    hs = [bb.hidden_states(torch.tensor([prompts[0] + g.token_ids]))[0].float() for g in gens]
    model = _model(fit_states(probe.embed([h[len(prompts[0]):] for h in hs] * 2), 4, seed=0).centroids, d, k)
    want = [ctl.encode_generations(bb, model, p, 2, gens) for p in prompts]
    memo = ctl.PromptPasses(keep=1)
    s0, none = ctl.encode_generations(bb, model, prompts[0], 2, [], passes=memo)
    assert torch.equal(s0, want[0][0]) and none == [] and memo.passes == 1
    for _ in range(2):  # the read-back decodes on the kept cache, and leaves it as it was
        s0, states = ctl.encode_generations(bb, model, prompts[0], 2, gens, passes=memo)
        assert torch.equal(s0, want[0][0]) and states == want[0][1] and memo.passes == 1
    for _ in range(2):  # run with its read-back (evicting prompt 0's cache), then read back on the kept cache
        s0, states = ctl.encode_generations(bb, model, prompts[1], 2, gens, passes=memo)
        assert torch.equal(s0, want[1][0]) and states == want[1][1] and memo.passes == 2
    assert torch.equal(ctl.encode_generations(bb, model, prompts[0], 2, [], passes=memo)[0], want[0][0])
    assert memo.passes == 2  # s_0 alone needs no cache
    assert ctl.encode_generations(bb, model, prompts[0], 2, gens, passes=memo)[1] == want[0][1] and memo.passes == 3


def test_prompt_passes_run_the_template_once_and_match_a_full_pass(tiny_llama):
    """Prompts that share their tokens before ``start`` (a template of at least MIN_SHARED_PREFIX tokens):
    the template is run once and each prompt's own tokens on its cache; s_0 and the read-back equal a full
    pass's up to float rounding."""
    from ctrls.generate.decoding import MIN_SHARED_PREFIX
    from ctrls.method.states import fit_states

    bb = tiny_llama
    tok = bb.tokenizer
    template = tok("You solve word problems step by step. " * 6)["input_ids"]
    assert len(template) >= MIN_SHARED_PREFIX
    prompts = [template + tok(q)["input_ids"] for q in ("Tom has 3 apples. How many?", "Ann has 5 pears. How many?")]
    start = len(template)
    rng = np.random.default_rng(2)
    gens = [_Gen(rng.integers(100, 5000, size=n).tolist(), [(0, 5), (5, n)]) for n in (11, 14)]
    d, k = bb.hidden_size, 2
    probe = _model(torch.zeros(4, k * d), d, k)
    hs = [bb.hidden_states(torch.tensor([p + g.token_ids]))[0].float() for p in prompts for g in gens]
    model = _model(fit_states(probe.embed([h[start:] for h in hs]), 4, seed=0).centroids, d, k)
    memo = ctl.PromptPasses(keep=2)
    for p in prompts:
        want_s0, want_states = ctl.encode_generations(bb, model, p, start, gens)  # one full pass
        s0, _ = ctl.encode_generations(bb, model, p, start, [], passes=memo)
        assert torch.allclose(s0, want_s0, atol=1e-5) and not torch.equal(
            s0, ctl.encode_generations(bb, model, prompts[1 - prompts.index(p)], start, [])[0])
        s0_again, states = ctl.encode_generations(bb, model, p, start, gens, passes=memo)  # on the kept cache
        assert torch.equal(s0_again, s0) and states == want_states
    assert memo.template_passes == 1 and memo.passes == 2


def test_the_prompt_memo_hands_out_copies_of_its_s0():
    import torch

    from ctrls.generate.controllability import PromptPasses

    p = PromptPasses()
    s0 = torch.tensor([0.25, 0.75])
    p.put(("k",), s0, None, in_use=False)
    s0.mul_(0)  # the caller's tensor changes: the memo's does not
    assert torch.equal(p.s0[("k",)], torch.tensor([0.25, 0.75]))


def test_the_prompt_memo_hands_each_caller_its_own_copy_of_s0(tiny_llama):
    """A caller that edits the s_0 it was handed in place (every Generation's encoded_s0 is one) changes neither
    the memo nor the s_0 a later call of the same prompt gets."""
    bb = tiny_llama
    d, k = bb.hidden_size, 2
    model = _model(_oracle_centroids(4, k * d), d, k)
    prompt = bb.tokenizer("Tom has 3 apples and buys 2 more. How many?")["input_ids"]
    memo = ctl.PromptPasses()
    for call in range(3):  # the pass, then twice from the memo
        s0, _ = ctl.encode_generations(bb, model, prompt, 0, [], passes=memo)
        if call == 0:
            want = s0.clone()
        assert torch.equal(s0, want)
        s0.mul_(0)  # the caller's edit
    assert memo.passes == 1 and torch.equal(next(iter(memo.s0.values())), want)
