"""The state prompt as a stage option (``state_prompt.use``): fit its vectors after pretraining, and decode
the exploration grid's CTRLS rows with them instead of the last-hidden adapter.

(g) ``state_prompt``, the pretraining stage after the adapter (``runs/<profile>/pretrain/<pair>/state_prompt/``):
m vectors per state (``ctrls.method.state_prompt``) fitted through the frozen backbone on the pretraining
chains, each step under its posterior state (the argmax of Q_phi, as stage (d) assigned it), with early
stopping on the held-out questions' chains (pretraining's validation split); written as safetensors.

The exploration stage then samples its fixed-s0 and epsilon rows with :func:`sample_state_prompt`: the
state chain of a sample is drawn before decoding (a_1 ~ pi~(. | s_0), a_{t+1} ~ pi~(. | a_t), hard states,
``ctrls.generate.controllability.draw_chains``; the fixed-s0 row keeps argmax s_0; both under the position
mask of ``grid.position_floor`` when it is set, ``position_mask_for``), the vectors of a_t
enter the KV cache when step t opens, and the sampler's rules hold (a step ends at a newline after a
non-blank line, the chain after the answer line, after T steps, at EOS or ``max_new_tokens``). Every
step's state is read back by Q_phi from an unadapted pass without the vectors (a re-encode: the decoding
pass holds the vectors, so its hidden states are not the backbone's). Sample m of a question draws its
tokens from the counter-based stream (seed, m), as the engine does, and its states from the question's
seed: the same whatever its batch.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ctrls.config.schema import Config
from ctrls.method.backbone import Backbone
from ctrls.method.state_prompt import Chain, StatePrompt, decode_chains, fit
from ctrls.stages.runs import Stage, artifact_error

log = logging.getLogger(__name__)

VECTORS = "vectors.safetensors"


def prompt_chains(cfg: Config, data, tok, split: str) -> list[Chain]:
    """Each pretraining chain of ``split`` ("train" or "heldout") with its prompt as the stages encode it and
    each step's posterior state (``data``: ``ctrls.stages.adapter_train.StepData``)."""
    from ctrls.stages.adapter_train import prompted_trajectories

    out = []
    for qi, ti, _, tr, ids in prompted_trajectories(cfg, data, tok, split):
        spans = [tuple(s) for s in tr["spans"].tolist()]
        rows = [data.row_of[(qi, ti, t)] for t in range(len(spans))]
        out.append(Chain(list(ids), tr["targets"].tolist(), spans, data.post[rows].argmax(1)))
    return out


def fit_state_prompt(cfg: Config, bb: Backbone, stages: dict[str, Stage], out: Path, progress: bool = True,
                     adapter_model=None) -> dict:
    """Stage (g): fit the vectors, write ``out/vectors.safetensors`` (the fit's history in its metadata);
    the stage's summary. ``adapter_model``: the pretrained ``CTRLSModel`` whose frozen adapter the vectors are
    fitted through (``state_prompt.with_adapter``)."""
    from safetensors.torch import save_file

    from ctrls.stages.adapter_train import StepData

    sp_cfg = cfg.state_prompt
    data = StepData.load(stages)
    K = int(data.post.shape[1])
    train, held = prompt_chains(cfg, data, bb.tokenizer, "train"), prompt_chains(cfg, data, bb.tokenizer, "heldout")
    if not train:
        raise ValueError(f"state prompt: no training chains in {stages['features'].dir}")
    held = held or train  # no held-out questions (pretrain.heldout_fraction = 0): stop on the training chains
    for p in bb.model.parameters():
        p.requires_grad_(False)

    def report(row: dict) -> None:
        log.info("state prompt epoch %d: held-out log P per token %.4f", row["epoch"], row["heldout_logp_per_token"])

    if sp_cfg.with_adapter and adapter_model is None:
        raise ValueError("state_prompt.with_adapter: fit_state_prompt needs the pretrained adapter (adapter_model)")
    head = _head(bb, adapter_model) if sp_cfg.with_adapter else None
    sp, info = fit(bb.model, train, held, K, sp_cfg.vectors, sp_cfg.lr, sp_cfg.epochs, sp_cfg.patience, sp_cfg.batch,
                   cfg.seed, on_epoch=report if progress else None, head=head)
    tmp = out / (VECTORS + ".tmp")
    save_file({"vectors": sp.vectors.detach().float().cpu().contiguous()}, str(tmp), metadata={"fit": json.dumps(info)})
    tmp.replace(out / VECTORS)
    return {"n_states": K, "vectors_per_state": sp_cfg.vectors, "with_adapter": sp_cfg.with_adapter,
            "train_chains": len(train), "heldout_chains": len(held),
            "kept_epoch": info["kept_epoch"], "epochs_run": len(info["history"]) - 1,
            "heldout_logp_per_token": info["history"][info["kept_epoch"]]["heldout_logp_per_token"],
            "initial_heldout_logp_per_token": info["history"][0]["heldout_logp_per_token"],
            "train_seconds": round(info["train_seconds"], 1)}


def _head(bb: Backbone, model):
    """The frozen last-hidden adapter of the CTRLS model ``model`` as the state prompt's head."""
    from ctrls.method.state_prompt import adapter_head

    for p in model.adapter.parameters():
        p.requires_grad_(False)
    return adapter_head(bb.model, model.adapter, model.centroids)


def load_state_prompt(st: Stage, bb: Backbone, n_states: int, n_vectors: int) -> StatePrompt:
    """The fitted vectors of a finished ``state_prompt`` stage ``st`` (``pretrain_stages(cfg)["state_prompt"]``),
    on the backbone's device; an error naming the file when it is missing, unreadable or does not fit
    (K, m, hidden size, finite)."""
    from safetensors import safe_open

    from ctrls.stages.collect import PretrainError

    if not st.is_done():
        raise PretrainError(f"no finished state prompt fit in {st.dir}"
                            + (f" ({'; '.join(st.problems)})" if st.problems else "")
                            + "; run the pretraining stage with state_prompt.use=true")
    path = st.dir / VECTORS
    try:
        with safe_open(str(path), "pt") as f:
            v = f.get_tensor("vectors")
    except Exception as e:
        raise artifact_error(path, e) from e
    emb = bb.model.get_input_embeddings().weight
    want = (n_states, n_vectors, emb.shape[1])
    if tuple(v.shape) != want or not torch.isfinite(v).all():
        raise artifact_error(path, ValueError(f"vectors of shape {tuple(v.shape)} (finite: {bool(torch.isfinite(v).all())}), "
                                              f"expected {want}, finite"))
    sp = StatePrompt(n_states, v.shape[1], emb.detach())
    with torch.no_grad():
        sp.vectors.copy_(v.to(sp.vectors.device))
    return sp


def pair_state_prompt(cfg: Config, bb: Backbone, model, st: dict[str, Stage]) -> tuple:
    """A pair's (fitted state prompt, position mask) for its CTRLS rows, from its pretraining stages ``st``
    (``pretrain_stages(cfg)``): the vectors with ``state_prompt.use``, the mask with ``grid.position_floor`` > 0
    (refused at load without the option), each else None."""
    K = int(model.config.n_states)
    sp = load_state_prompt(st["state_prompt"], bb, K, cfg.state_prompt.vectors) if cfg.state_prompt.use else None
    return sp, position_mask_for(cfg, st["states"].dir, K) if cfg.grid.position_floor > 0 else None


def position_mask_for(cfg: Config, states_dir: Path, n_states: int):
    """The pair's position mask (``ctrls.method.positions``) at ``grid.position_floor`` and
    ``grid.position_buckets``, from its pretraining chains' training steps (stage (d)'s hard states; the
    held-out questions' steps are left out): a choice made on training data only."""
    from ctrls.method.positions import position_mask

    path = states_dir / "states.pt"  # stage (d)'s directory: pretrain_stages(cfg)["states"].dir
    try:
        st = torch.load(path, weights_only=True)
        post, index, held = st["s_post"], st["index"], st["heldout"].bool()
    except Exception as e:
        raise artifact_error(path, e) from e
    keep = ~held
    return position_mask(index[keep, 2], post[keep].argmax(-1), n_states, cfg.grid.position_buckets,
                         cfg.grid.position_floor)


def row_sampler(key: int, temperature: float, top_k: int):
    """Row ``key``'s token draw: the engine's Gumbel-max on its counter-based stream (counter = tokens so far)."""
    from ctrls.generate.decoding import candidates, draw_tokens

    n = 0

    def draw(logits: torch.Tensor) -> int:
        nonlocal n
        vals, idx = candidates(logits[None].float(), temperature, top_k)
        tok = draw_tokens(vals, idx, temperature, torch.tensor([key]), torch.tensor([n]))
        n += 1
        return int(tok[0])

    return draw


@torch.no_grad()
def sample_state_prompt(bb: Backbone, model, sp: StatePrompt, prompts: Sequence[tuple[list[int], int]], n: int,
                        params, seeds: Sequence[int], layer: int = -1, mask=None, with_adapter: bool = False,
                        sample_ids: Sequence[Sequence[int]] | None = None, policies: Sequence | None = None,
                        epsilons: Sequence[float] | None = None, readback: bool = True,
                        passes=None) -> list[list]:
    """``n`` samples of each (prompt ids, s_0 start) decoded under the state prompt (module docstring), with
    ``params`` (``ctrls.generate.decoding.SampleParams``: temperature, top_k, max_new_tokens, max_steps,
    epsilon, transitions, stop_at_answer). With ``mask`` (``ctrls.method.positions.PositionMask``) the drawn
    chains keep to the states that can occur at each step, and the fixed-s0 row holds s_0 only where it can
    (``PositionMask.fixed``); ``with_adapter``: ``model``'s adapter applied as well (``state_prompt.with_adapter``).
    RL (``ctrls.stages.rl``): ``sample_ids`` (each prompt's sample indices, in place of ``range(n)``: a
    sample's chain and tokens do not depend on which others are drawn), ``policies`` and ``epsilons`` (each
    prompt's, in place of ``model.policy`` and ``params.epsilon``); ``readback=False`` skips the read-back.
    At most ``params.batch_size`` rows (prompts x samples) are decoded together (``ctrls.generate.sampling.row_groups``), and each
    group's KV cache is freed before the next: the RL stage's lockstep table rows are several hundred.
    ``passes`` (``ctrls.generate.controllability.PromptPasses``, for ``model``'s Q_phi): each prompt's pass is run
    once across the calls that share it (s_0 before decoding, the read-back's KV cache after); by default, once
    within this call.
    Returns one list of ``Generation`` per prompt, each with ``states`` (s_0, then each step's drawn state,
    one-hot), ``encoded`` and ``encoded_s0`` (the read-back), and, with transitions, Eq. 16's trajectory:
    ``policy_states`` (s_0, then every action drawn for a step opened), ``log_actions`` and ``allowed``."""
    from ctrls.data.prompts import ANSWER_LINE, check_prompts, content_token, join_blank_tail, model_positions, newline_token_ids
    from ctrls.generate.controllability import PromptPasses, draw_actions, encode_generations
    from ctrls.generate.decoding import Generation, eos_ids
    from ctrls.generate.kv_cache import new_cache
    from ctrls.generate.sampling import row_groups, seeded
    from ctrls.method.streams import stream_key

    tok, T, K = bb.tokenizer, params.max_steps, sp.n_states
    m_vec = int(sp.vectors.shape[1])
    if m_vec < 1:
        raise ValueError("the state prompt has 0 vectors per state: decode such rows as Base (no state prompt)")
    # the engine's checks (ctrls.generate.sampling.sample), with the positions the vectors take: T steps x m
    check_prompts([ids for ids, _ in prompts], params.max_new_tokens, model_positions(bb), extra=T * m_vec,
                  extra_why=f"the state prompt's vectors (prompt.max_steps={T} x state_prompt.vectors={m_vec})")
    bad = [i for i, (ids, start) in enumerate(prompts) if not 0 <= int(start) < len(ids)]
    if bad:
        i = bad[0]
        raise ValueError(f"prompt {i}: its s_0 start {prompts[i][1]} is not among its {len(prompts[i][0])} tokens")
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts: one seed per prompt")
    nl = set(newline_token_ids(tok))
    ids_of = [list(range(n)) for _ in prompts] if sample_ids is None else [list(x) for x in sample_ids]

    def closes(step: list[int], steps: int) -> str | None:  # the engine's rules (ctrls.generate.decoding.advance)
        if params.stop_at_answer and ANSWER_LINE.search(tok.decode(step)):
            return "answer"
        return "max_steps" if steps >= T else None

    if passes is None:  # the read-back decodes on the KV cache of the pass that gave s_0
        passes = PromptPasses(keep=len(prompts) if readback else 0)
    s0s, chains, drawn_actions = [], [], []
    for i, ((ids, start), seed) in enumerate(zip(prompts, seeds)):
        s0, _ = encode_generations(bb, model, ids, start, [], layer=layer, passes=passes)
        s0s.append(s0)
        if params.transitions:  # every sample index up to the largest drawn: the same chains on any shard
            policy = model.policy if policies is None else policies[i]
            eps = params.epsilon if epsilons is None else epsilons[i]
            acts, logs = draw_actions(policy, s0, max(ids_of[i], default=-1) + 1, T, eps,
                                      generator=seeded(seed, policy.L.device), mask=mask)
            drawn_actions.append((acts, logs))
            chains.append({m: acts[m].argmax(-1).tolist() for m in ids_of[i]})
        else:  # the fixed-s0 row: every step under argmax s_0 (where it can occur, with a mask, unless hold="s0");
            # a constant-state row (hold=j): every step under state j, no mask
            if isinstance(params.hold, int) and not 0 <= params.hold < K:
                raise ValueError(f"hold={params.hold}: a constant state must lie in [0, {K}) (K = {K} states)")
            if isinstance(params.hold, int):
                fixed = [params.hold] * T
            elif params.hold == "s0" or mask is None:
                fixed = [int(s0.argmax())] * T
            else:
                fixed = mask.fixed(int(s0.argmax()), T)
            chains.append({m: list(fixed) for m in ids_of[i]})
    flat = [(i, m) for i in range(len(prompts)) for m in ids_of[i]]
    out: list[list] = [[] for _ in prompts]
    if not flat:
        return out
    decoded = []
    for group in row_groups([len(ids_of[i]) for i in range(len(prompts))], params.batch_size):
        rows = [(i, m) for i in group for m in ids_of[i]]
        capacity = max(len(prompts[i][0]) for i in group) + params.max_new_tokens + T * sp.vectors.shape[1]
        # the engine's preallocated cache; on sdpa, ragged passes (ctrls.method.ragged) put only real slots through the model
        decoded += decode_chains(
            bb.model, [prompts[i][0] for i, _ in rows], [lambda t, c=chains[i][m]: int(c[t]) for i, m in rows], sp,
            ends_step=lambda x, has: x in nl and has, has_content=content_token(tok),
            max_new_tokens=params.max_new_tokens, max_steps=T,
            sample=[row_sampler(stream_key(seeds[i], m), params.temperature, params.top_k) for i, m in rows],
            stop=eos_ids(bb), closes_chain=closes, cache=new_cache(bb.model, capacity),
            head=_head(bb, model) if with_adapter else None)
    for (i, m), d in zip(flat, decoded):
        spans = join_blank_tail(d.token_ids, list(d.spans), tok)  # as the engine's _end_step
        drawn = F.one_hot(torch.as_tensor(d.states[:len(spans)], dtype=torch.long), K).float()
        states = torch.cat([s0s[i].float().cpu()[None], drawn.reshape(-1, K)])
        g = Generation(prompt_index=i, sample_index=m, token_ids=d.token_ids, text=tok.decode(d.token_ids),
                       steps=[tok.decode(d.token_ids[a:b]).strip() for a, b in spans], spans=spans,
                       finish=d.finish, states=states)
        if params.transitions:  # every draw that conditioned a token: each state's vectors precede the next token
            D, (acts, logs) = len(d.states), drawn_actions[i]
            g.policy_states = torch.cat([s0s[i].float().cpu()[None], acts[m, :D].float()])
            g.log_actions = logs[m, :D]
            g.allowed = None if mask is None else torch.stack([mask.allowed[mask.bucket(t)] for t in range(D)]).reshape(D, K)
        out[i].append(g)
    for i, (ids, start) in enumerate(prompts if readback else ()):  # the read-back: an unadapted pass without the vectors
        s0, encoded = encode_generations(bb, model, ids, start, out[i], layer=layer, passes=passes)
        for g, e in zip(out[i], encoded):
            g.encoded, g.encoded_s0 = list(e), s0
    return out


__all__ = ["VECTORS", "fit_state_prompt", "load_state_prompt", "pair_state_prompt", "position_mask_for", "prompt_chains",
           "row_sampler", "sample_state_prompt"]
