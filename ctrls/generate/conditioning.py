"""How the engine (:mod:`ctrls.generate.sampling`) conditions a decode on the latent state: one interface,
three kinds, chosen by ``sample(..., conditioning=)``.

- :class:`Conditioning`: Base, no state: plain sampling.
- :class:`AdapterConditioning`: CTRLS through the last-hidden adapter (Eq. 8). s_0 = Q_phi(x_0) (Eq. 5) from
  the prefill's hidden states, s_{t+1} ~ pi~(. | s_t) drawn when step t closes from the row's counter-based
  stream, and every position that predicts step t+1 is read through E'(h, z_{t+1}).
- :class:`StatePromptConditioning`: CTRLS through the state prompt (``ctrls.method.state_prompt``): a sample's
  state chain a_1, a_2, ... is drawn before decoding from its question's seed (``controllability.draw_actions``),
  and the m vectors of a_t enter the KV cache when step t opens (a ragged pass, :mod:`ctrls.generate.ragged`);
  with a ``head`` the adapter of Eq. 8 is applied to the last hidden state as well.

The engine calls, per group of rows: :meth:`~Conditioning.start` after the prefill (s_0 and the state of the
first step), :meth:`~Conditioning.vectors` for the rows that open a step (extra input embeddings, or None),
:meth:`~Conditioning.logits` at every draw, :meth:`~Conditioning.redraw` for the rows whose step closed, and
:meth:`~Conditioning.finish` on the generations. Stopping rules, the shared prefix, finished-row dropping and
the token draw are the engine's, the same for all three.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from ctrls.generate.decoding import Generation, Row, SampleParams
    from ctrls.method.model import CTRLSModel
    from ctrls.method.policy import TransitionPolicy  # noqa: F401 (the rows' policies)
    from ctrls.method.positions import PositionMask
    from ctrls.method.state_prompt import Head, StatePrompt


class Conditioning:
    """Base: no latent state. The subclasses override the hooks they need."""

    model: "CTRLSModel | None" = None  # the CTRLS model whose states condition the decode (None: Base)
    feeds_vectors = False  # whether a step's state enters as input embeddings (the passes are then ragged)

    def extra_positions(self, params: "SampleParams") -> int:
        """Cache positions a row takes beyond its prompt and ``max_new_tokens``."""
        return 0

    def check(self, params: "SampleParams", n_prompts: int, policies, epsilons) -> None:
        """Refuse what this conditioning cannot decode, before any work."""
        for name, per in (("policies", policies), ("epsilons", epsilons)):
            if per is not None:
                raise ValueError(f"{name} needs a CTRLS model (Base rows draw no state)")

    def prepare(self, backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], seeds: Sequence[int],
                sample_ids: Sequence[Sequence[int]], params: "SampleParams", policies, epsilons) -> None:
        """Called once per ``sample`` call, before its first group."""

    def start(self, rows: Sequence["Row"], expand: torch.Tensor, prompt_hidden: Callable[[], list[torch.Tensor]],
              params: "SampleParams") -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """After a group's prefill: (the state (B, K) that conditions each row's first token, each prompt's s_0),
        both None for Base. ``prompt_hidden()``: each prompt's hidden states from its s_0 start."""
        return None, None

    def vectors(self, rows: Sequence["Row"]) -> list[torch.Tensor] | None:
        """The input embeddings (m, d) each of ``rows`` feeds as it opens a step, or None (no vectors)."""
        return None

    def logits(self, head, h: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """The next-token logits (B, V) from the last hidden states ``h`` (B, d)."""
        return head(h[:, None])[:, 0]  # a 3-D input takes a faster GEMM path than a (B, d) matrix on CPU

    def redraw(self, params: "SampleParams", state: torch.Tensor | None, idx: Sequence[int],
               rows: Sequence["Row"]) -> torch.Tensor | None:
        """The state after the rows at batch positions ``idx`` (``rows``) closed a step."""
        return state

    def finish(self, gens: list[list["Generation"]], rows: Sequence["Row"], expand: torch.Tensor) -> None:
        """Complete the group's generations (grouped by prompt, in the rows' order)."""


class AdapterConditioning(Conditioning):
    """CTRLS through the last-hidden adapter (Eq. 8): the state is drawn as the decode goes."""

    def __init__(self, model: "CTRLSModel"):
        self.model = model

    def check(self, params, n_prompts, policies, epsilons) -> None:
        for name, per in (("policies", policies), ("epsilons", epsilons)):
            if per is not None and len(per) != n_prompts:
                raise ValueError(f"{name} needs one entry per prompt: {len(per)} for {n_prompts} prompts")

    def start(self, rows, expand, prompt_hidden, params):
        model = self.model
        s0 = model.encode(prompt_hidden())  # Eq. 5: s_0 = Q_phi(x_0)
        state = s0[expand.to(s0.device)]
        for r, a in zip(rows, state):
            r.states.append(a.float().cpu())
        if params.transitions:
            log_s1 = draw_states(model, state, rows, params.epsilon)
            record_states(rows, log_s1)
            state = log_s1.exp().to(state.dtype)
        else:  # the fixed-s0 ablation: no state is drawn; s_0 (or the held state) is recorded for every step
            if isinstance(params.hold, int):  # a constant-state row: every step under state j, whatever s_0 is
                state = held_state(params.hold, state)
            for r, b in zip(rows, state.float().cpu()):
                r.states.append(b)
        return state, s0

    def logits(self, head, h, state):
        return head(self.model.adapt(h, state)[:, None])[:, 0]  # Eq. 8, then the LM head

    def redraw(self, params, state, idx, rows):
        return redraw_states(self.model, params, state, idx, rows)


class StatePromptConditioning(Conditioning):
    """CTRLS through the state prompt: each sample's chain drawn before decoding, its vectors fed as each
    step opens (module docstring). ``model`` encodes s_0 (on layer ``layer``'s hidden states of the prompt's
    own pass, ``controllability.encode_generations``) and holds the policy; ``mask``
    (``ctrls.method.positions.PositionMask``) keeps the drawn chains to the states that can occur at each
    step, and the fixed-s0 row holds s_0 only where it can (``PositionMask.fixed``; ``hold="s0"``: everywhere);
    ``head`` (``ctrls.method.state_prompt.adapter_head``): the last-hidden adapter as well. ``passes``
    (``controllability.PromptPasses``): each prompt's pass run once across the calls that share it."""

    feeds_vectors = True

    def __init__(self, model: "CTRLSModel", prompt_vectors: "StatePrompt", mask: "PositionMask | None" = None,
                 head: "Head | None" = None, passes=None, layer: int = -1):
        if int(prompt_vectors.vectors.shape[1]) < 1:
            raise ValueError("the state prompt has 0 vectors per state: decode such rows as Base (no state prompt)")
        self.model, self.prompt_vectors, self.mask, self.head, self.layer = model, prompt_vectors, mask, head, layer
        self.passes = passes
        self.s0: dict[int, torch.Tensor] = {}
        self.chains: dict[tuple[int, int], list[int]] = {}
        self.actions: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.transitions = True

    @property
    def n_states(self) -> int:
        return self.prompt_vectors.n_states

    def extra_positions(self, params) -> int:
        return params.max_steps * int(self.prompt_vectors.vectors.shape[1])  # T steps x m vectors

    def check(self, params, n_prompts, policies, epsilons) -> None:
        AdapterConditioning.check(self, params, n_prompts, policies, epsilons)
        if isinstance(params.hold, int) and not params.transitions and not 0 <= params.hold < self.n_states:
            raise ValueError(f"hold={params.hold}: a constant state must lie in [0, {self.n_states}) "
                             f"(K = {self.n_states} states)")

    def prepare(self, backbone, prompts, starts, seeds, sample_ids, params, policies, epsilons) -> None:
        """s_0 of every prompt, and every sample's state chain (module docstring)."""
        from ctrls.generate.controllability import PromptPasses, draw_actions, encode_generations

        T = params.max_steps
        if self.passes is None:  # the read-back decodes on the KV cache of the pass that gave s_0
            self.passes = PromptPasses(keep=len(prompts))
        self.transitions = params.transitions
        self.s0, self.chains, self.actions = {}, {}, {}
        for i, (ids, start, seed) in enumerate(zip(prompts, starts, seeds)):
            s0, _ = encode_generations(backbone, self.model, ids, start, [], layer=self.layer, passes=self.passes)
            self.s0[i] = s0
            ms = list(sample_ids[i])
            if params.transitions:  # every sample index up to the largest drawn: the same chains on any shard
                policy = self.model.policy if policies is None else policies[i]
                eps = params.epsilon if epsilons is None else epsilons[i]
                acts, logs = draw_actions(policy, s0, max(ms, default=-1) + 1, T, eps,
                                          generator=torch.Generator(policy.L.device).manual_seed(seed),
                                          mask=self.mask)
                self.actions[i] = (acts, logs)
                hard = acts.argmax(-1).tolist()
                self.chains.update({(i, m): hard[m] for m in ms})
            else:  # the fixed-s0 row: every step under argmax s_0 (where it can occur, with a mask, unless
                # hold="s0"); a constant-state row (hold=j): every step under state j, no mask
                if isinstance(params.hold, int):
                    fixed = [params.hold] * T
                elif params.hold == "s0" or self.mask is None:
                    fixed = [int(s0.argmax())] * T
                else:
                    fixed = self.mask.fixed(int(s0.argmax()), T)
                self.chains.update({(i, m): list(fixed) for m in ms})

    def _open(self, r: "Row") -> int:
        """Row ``r`` opens its next step: its state, recorded (one-hot) after s_0 and the earlier ones."""
        k = int(self.chains[(r.prompt_index, r.sample_index)][len(r.states) - 1])
        r.states.append(F.one_hot(torch.as_tensor(k), self.n_states).float())
        return k

    def start(self, rows, expand, prompt_hidden, params):
        for r in rows:
            r.states.append(self.s0[r.prompt_index].float().cpu())
        if params.max_steps <= 0:
            return None, None
        dev = self.prompt_vectors.vectors.device
        ks = [self._open(r) for r in rows]
        return F.one_hot(torch.as_tensor(ks, device=dev), self.n_states).float(), None

    def vectors(self, rows):
        dt = self.prompt_vectors.vectors.dtype
        return [self.prompt_vectors(r.states[-1].to(dt)) for r in rows]  # V(z) = sum_k z_k V_k

    def logits(self, head, h, state):
        if self.head is None:
            return head(h[:, None])[:, 0]
        return self.head(h, state.float())  # each token under the state of the step it belongs to (Eq. 8)

    def redraw(self, params, state, idx, rows):
        if state is None:
            return state
        state = state.clone()
        for j, r in zip(idx, rows):
            k = self._open(r)
            state[j] = F.one_hot(torch.as_tensor(k), self.n_states).to(state)
        return state

    def finish(self, gens, rows, expand) -> None:
        K, mask = self.n_states, self.mask
        of = {(r.prompt_index, r.sample_index): r for r in rows}
        for gs in gens:
            for g in gs:
                row = of[g.prompt_index, g.sample_index]
                g.log_actions = g.policy_states = None
                if not self.transitions:
                    continue
                D = len(row.states) - 1  # every state opened: its vectors precede the next token drawn
                acts, logs = self.actions[g.prompt_index]
                g.policy_states = torch.cat([self.s0[g.prompt_index].float().cpu()[None], acts[g.sample_index, :D].float()])
                g.log_actions = logs[g.sample_index, :D]
                g.allowed = None if mask is None else torch.stack(
                    [mask.allowed[mask.bucket(t)] for t in range(D)]).reshape(D, K)


# ---- the adapter's state draws, s_{t+1} ~ pi~(. | s_t) from each row's counter-based stream -----------


def draw_states(model: "CTRLSModel", prev: torch.Tensor, rows: Sequence["Row"], epsilon: float) -> torch.Tensor:
    """log s_{t+1} (B, K), s_{t+1} ~ pi~(. | s_t) for every row at once (float64): row b's draw comes from
    its counter-based stream (row key, draw index) alone (``policy.sample_policy_log_streams``), so it
    does not depend on its batch-mates. Each row uses its own policy and epsilon when it has them
    (lockstep RL: one batch, many policies), else ``model.policy`` and ``epsilon``. The exact
    log-actions are kept for Eq. 16 (``policy`` module docstring)."""
    from ctrls.method.policy import sample_policy_log_streams

    dev = model.policy.L.device
    keys = torch.tensor([r.key for r in rows], dtype=torch.int64, device=dev)
    counters = torch.tensor([len(r.states) for r in rows], dtype=torch.int64, device=dev)
    if all(r.policy is None and r.epsilon is None for r in rows):
        return model.policy.sample_log_streams(prev, epsilon, keys, counters)
    prev = prev.to(dev)
    alpha = torch.empty(prev.shape, dtype=model.policy.L.dtype, device=dev)
    groups: dict[int, list[int]] = {}
    for j, r in enumerate(rows):
        groups.setdefault(id(r.policy), []).append(j)
    for idx in groups.values():  # one concentration per distinct policy in the batch
        pol = rows[idx[0]].policy if rows[idx[0]].policy is not None else model.policy
        sel = torch.as_tensor(idx, device=dev)
        alpha[sel] = pol.concentration(prev[sel]).to(alpha.dtype)
    eps = torch.tensor([epsilon if r.epsilon is None else r.epsilon for r in rows], dtype=torch.float64, device=dev)
    return sample_policy_log_streams(alpha, eps, keys, counters)


def record_states(rows: Sequence["Row"], log_a: torch.Tensor) -> None:
    log_a = log_a.double().cpu()  # one device-to-host copy for all rows
    for r, la, s in zip(rows, log_a, log_a.exp().float()):
        r.log_actions.append(la)
        r.states.append(s)


def held_state(j: int, like: torch.Tensor) -> torch.Tensor:
    """One-hot state ``j`` for every row of ``like`` (rows x K), its dtype and device; an error naming j and K
    when j is not a state."""
    K = like.shape[-1]
    if not 0 <= j < K:
        raise ValueError(f"hold={j}: a constant state must lie in [0, {K}) (K = {K} states)")
    return torch.nn.functional.one_hot(torch.full(like.shape[:-1], j, dtype=torch.long, device=like.device), K).to(like.dtype)


def redraw_states(model: "CTRLSModel", params: SampleParams, state: torch.Tensor, idx: Sequence[int],
                  redraw_rows: Sequence[Row]) -> torch.Tensor:
    """Draw s_{t+1} for the rows at batch positions ``idx`` whose step closed; returns the new state
    tensor (with the fixed-s0 ablation the state stays s_0 and is recorded once per step)."""
    at = torch.as_tensor(list(idx), device=state.device)
    if params.transitions:
        log_new = draw_states(model, state[at], redraw_rows, params.epsilon)
        record_states(redraw_rows, log_new)
        state = state.clone()
        state[at] = log_new.exp().to(state.dtype)
    else:
        for r, b in zip(redraw_rows, state[at].float().cpu()):
            r.states.append(b)
    return state


def conditioning_for(model: "CTRLSModel | None", conditioning: Conditioning | None = None) -> Conditioning:
    """The conditioning of a ``sample`` call: ``conditioning`` when given, else the adapter's for a CTRLS
    ``model``, else Base."""
    if conditioning is not None:
        if model is not None and conditioning.model is not model:
            raise ValueError("sample: pass the CTRLS model through the conditioning, not beside it")
        return conditioning
    return AdapterConditioning(model) if model is not None else Conditioning()


__all__ = ["AdapterConditioning", "Conditioning", "StatePromptConditioning", "conditioning_for", "draw_states",
           "held_state", "record_states", "redraw_states"]
