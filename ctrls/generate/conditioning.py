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
- :class:`LockstepConditioning`: several training runs' rows in one batch, each row under its own run's
  conditioning (one of the kinds above), the backbone's passes shared.

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

    def logits(self, head, h: torch.Tensor, state: torch.Tensor | None, rows: Sequence["Row"]) -> torch.Tensor:
        """The next-token logits (B, V) from the last hidden states ``h`` (B, d) of ``rows``."""
        return head(h[:, None])[:, 0]  # a 3-D input takes a faster GEMM path than a (B, d) matrix on CPU

    def redraw(self, params: "SampleParams", state: torch.Tensor | None, idx: Sequence[int],
               rows: Sequence["Row"]) -> torch.Tensor | None:
        """The state after the rows at batch positions ``idx`` (``rows``) closed a step."""
        return state

    def finish(self, gens: list[list["Generation"]], rows: Sequence["Row"], expand: torch.Tensor) -> None:
        """Complete the group's generations (grouped by prompt, in the rows' order)."""

    def read_back(self, backbone, prompts, starts, out: list[list["Generation"]], model: "CTRLSModel") -> None:
        """Fill each generation's ``encoded`` and ``encoded_s0`` by a re-encode (``feeds_vectors`` only: the
        other conditionings read the states back from the decoding pass)."""
        raise NotImplementedError


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

    def logits(self, head, h, state, rows):
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
        if isinstance(params.hold, int) and not params.transitions:
            check_hold(params.hold, self.n_states)

    def prepare(self, backbone, prompts, starts, seeds, sample_ids, params, policies, epsilons,
                index: Sequence[int] | None = None) -> None:
        """s_0 of every prompt, and every sample's state chain (module docstring); ``index``: the prompts'
        indices in the ``sample`` call (default 0, 1, ...), which key the rows."""
        from ctrls.generate.controllability import PromptPasses, draw_actions, encode_generations

        T = params.max_steps
        if self.passes is None:  # the read-back decodes on the KV cache of the pass that gave s_0
            self.passes = PromptPasses(keep=len(prompts))
        self.transitions = params.transitions
        self.s0, self.chains, self.actions = {}, {}, {}
        for j, (ids, start, seed) in enumerate(zip(prompts, starts, seeds)):
            i = j if index is None else index[j]
            s0, _ = encode_generations(backbone, self.model, ids, start, [], layer=self.layer, passes=self.passes)
            self.s0[i] = s0
            ms = list(sample_ids[j])
            if params.transitions:  # every sample index up to the largest drawn: the same chains on any shard
                policy = self.model.policy if policies is None else policies[j]
                eps = params.epsilon if epsilons is None else epsilons[j]
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

    def logits(self, head, h, state, rows):
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

    def read_back(self, backbone, prompts, starts, out, model) -> None:
        from ctrls.generate.controllability import encode_generations

        for p, st, gs in zip(prompts, starts, out):  # an unadapted pass without the vectors, on s_0's KV cache
            if not gs:
                continue
            s0, encoded = encode_generations(backbone, model, p, st, gs, layer=self.layer, passes=self.passes)
            for g, e in zip(gs, encoded):
                g.encoded, g.encoded_s0 = list(e), s0


class LockstepConditioning(Conditioning):
    """Several training runs decoded in one batch over the frozen backbone's passes: prompt i of the ``sample``
    call belongs to run ``owner[i]``, whose conditioning ``parts[owner[i]]`` (its Q_phi, policy, vectors, mask,
    adapter) conditions its rows; the passes, the token draw and the stopping rules are shared. A sample is the
    one its run decodes alone, up to the batch's float rounding (rows do not see each other)."""

    def __init__(self, parts: Sequence[Conditioning], owner: Sequence[int]):
        kinds = {type(p) for p in parts}
        if not parts or len(kinds) != 1:
            raise ValueError(f"runs in lockstep need one kind of conditioning, got {sorted(k.__name__ for k in kinds)}")
        if not all(0 <= o < len(parts) for o in owner):
            raise ValueError(f"owner names runs outside [0, {len(parts)}): {sorted(set(owner))}")
        self.parts, self.owner = list(parts), list(owner)
        self.model = parts[0].model  # not None: CTRLS rows (each run's own model conditions them)
        self.feeds_vectors = parts[0].feeds_vectors
        self._shared_logits = all(type(p) is Conditioning or (isinstance(p, StatePromptConditioning) and p.head is None)
                                  for p in parts)  # one LM head for every row: no split by run

    def _split(self, rows) -> list[tuple[Conditioning, list[int]]]:
        """(part, positions in ``rows`` of its rows) for each run with rows in ``rows``."""
        at: dict[int, list[int]] = {}
        for b, r in enumerate(rows):
            at.setdefault(self.owner[r.prompt_index], []).append(b)
        return [(self.parts[p], idx) for p, idx in sorted(at.items())]

    def _prompts_of(self, n: int) -> list[list[int]]:
        if len(self.owner) != n:
            raise ValueError(f"owner has {len(self.owner)} entries for {n} prompts: one run per prompt")
        return [[i for i in range(n) if self.owner[i] == p] for p in range(len(self.parts))]

    def extra_positions(self, params) -> int:
        return max(p.extra_positions(params) for p in self.parts)

    def check(self, params, n_prompts, policies, epsilons) -> None:
        for part, idx in zip(self.parts, self._prompts_of(n_prompts)):
            part.check(params, len(idx), None if policies is None else [policies[i] for i in idx],
                       None if epsilons is None else [epsilons[i] for i in idx])

    def prepare(self, backbone, prompts, starts, seeds, sample_ids, params, policies, epsilons) -> None:
        for part, idx in zip(self.parts, self._prompts_of(len(prompts))):
            if not idx or not isinstance(part, StatePromptConditioning):
                continue
            part.prepare(backbone, [prompts[i] for i in idx], [starts[i] for i in idx], [seeds[i] for i in idx],
                         [sample_ids[i] for i in idx], params, None if policies is None else [policies[i] for i in idx],
                         None if epsilons is None else [epsilons[i] for i in idx], index=idx)

    def start(self, rows, expand, prompt_hidden, params):
        hidden: list = []
        state = None
        for part, idx in self._split(rows):
            pos = sorted({int(expand[b]) for b in idx})  # the group's prompts of this run
            loc = {q: j for j, q in enumerate(pos)}

            def own(pos=pos):
                if not hidden:
                    hidden.extend(prompt_hidden())
                return [hidden[q] for q in pos]

            st, _ = part.start([rows[b] for b in idx], torch.as_tensor([loc[int(expand[b])] for b in idx]), own, params)
            if st is None:
                continue
            if state is None:
                state = st.new_zeros((len(rows), st.shape[-1]))
            state[torch.as_tensor(idx, device=st.device)] = st
        return state, None  # no shared s_0: each run's Q_phi encodes its own

    def vectors(self, rows):
        return [self.parts[self.owner[r.prompt_index]].vectors([r])[0] for r in rows]

    def logits(self, head, h, state, rows):
        if self._shared_logits:
            return self.parts[0].logits(head, h, state, rows)
        out = None
        for part, idx in self._split(rows):
            at = torch.as_tensor(idx, device=h.device)
            lg = part.logits(head, h[at], None if state is None else state[at], [rows[b] for b in idx])
            out = lg.new_empty((len(rows), lg.shape[-1])) if out is None else out
            out[at] = lg
        return out

    def redraw(self, params, state, idx, rows):
        for part, sub in self._split(rows):
            state = part.redraw(params, state, [idx[k] for k in sub], [rows[k] for k in sub])
        return state

    def finish(self, gens, rows, expand) -> None:
        for part, idx in self._split(rows):
            p = self.owner[rows[idx[0]].prompt_index]
            part.finish([[g for g in gs if self.owner[g.prompt_index] == p] for gs in gens], [rows[b] for b in idx], expand)

    def read_back(self, backbone, prompts, starts, out, model) -> None:
        for part, idx in zip(self.parts, self._prompts_of(len(prompts))):
            if idx:
                part.read_back(backbone, [prompts[i] for i in idx], [starts[i] for i in idx], [out[i] for i in idx],
                               part.model)


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


def check_hold(j: int, K: int) -> None:
    """Refuse a constant state ``j`` that is not one of the K states, naming j and K."""
    if not 0 <= j < K:
        raise ValueError(f"hold={j}: a constant state must lie in [0, {K}) (K = {K} states)")


def held_state(j: int, like: torch.Tensor) -> torch.Tensor:
    """One-hot state ``j`` for every row of ``like`` (rows x K), its dtype and device; an error naming j and K
    when j is not a state."""
    K = like.shape[-1]
    check_hold(j, K)
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


__all__ = ["AdapterConditioning", "Conditioning", "LockstepConditioning", "StatePromptConditioning", "conditioning_for",
           "check_hold", "draw_states", "held_state", "record_states", "redraw_states"]
