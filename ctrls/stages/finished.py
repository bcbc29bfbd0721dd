"""A finished run, loaded for use from Python: the config, the frozen backbone, the pretrained CTRLS model and
its conditioning (the state prompt with its position mask, or the adapter), and ``sample``, which decodes new
questions as the exploration stage decodes its rows (the same prompts, rows and seeds: a test question sampled
here gives the stage's own samples).

    run = ctrls.load_run("demo")                     # or load_run(run_dir="runs", overrides=[...])
    gens = run.sample(["Ana has 4 cards. She gets 6 more. How many cards does she have?"], row="eps=0.1")
    print(gens[0][0].text, gens[0][0].states.argmax(-1).tolist())
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ctrls.config.schema import Config, load_config


@dataclass
class LoadedRun:
    """A finished run's parts (:func:`load_run`)."""

    cfg: Config
    backbone: object  # ctrls.method.backbone.Backbone
    model: object  # ctrls.method.model.CTRLSModel
    state_prompt: object | None  # ctrls.method.state_prompt.StatePrompt with state_prompt.use, else None
    mask: object | None  # ctrls.method.positions.PositionMask with grid.position_floor > 0, else None

    @property
    def rows(self) -> list[str]:
        """The rows this run's grid can decode: "Base", "fixed s0", "eps=0.1", ... (``ctrls.stages.exploration.grid_rows``)."""
        from ctrls.stages.exploration import grid_rows

        return [r.label for r in grid_rows(self.cfg)]

    def sample(self, questions: Sequence, row: str | None = None, n: int | None = None, temperature: float | None = None,
               seeds: Sequence[int] | None = None) -> list[list]:
        """``n`` (default ``grid.n_samples``) chains of thought for each question (a string, or a ``Problem`` of
        the run's data, whose id seeds it as the stage does), decoded under ``row`` (default the first CTRLS(ε)
        row): Base, the adapter or the state prompt, as the run's config says. One list of ``Generation`` per
        question, each with its drawn ``states`` and the read-back ``encoded``."""
        from ctrls.data.prompts import encode_prompt
        from ctrls.generate.sampling import sample
        from ctrls.method.streams import seed_of
        from ctrls.stages.common import sample_params
        from ctrls.stages.exploration import grid_rows
        from ctrls.stages.state_prompt import ctrls_conditioning

        cfg, bb = self.cfg, self.backbone
        rows = {r.label: r for r in grid_rows(cfg)}
        label = row or next((lab for lab, r in rows.items() if r.transitions), "Base")
        if label not in rows:
            raise ValueError(f"row {label!r} is not one of this run's rows: {', '.join(rows)}")
        r, eta = rows[label], cfg.grid.temperatures[0] if temperature is None else temperature
        n = cfg.grid.n_samples if n is None else n
        texts = [q if isinstance(q, str) else q.question for q in questions]
        enc = [encode_prompt(bb.tokenizer, t, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for t in texts]
        if seeds is None:  # a Problem is seeded by its id as the exploration stage seeds it; a string by its text
            seeds = [seed_of(cfg.seed, cfg.backbone.name, cfg.data.dataset, eta, label, getattr(q, "id", q)) for q in questions]
        params = sample_params(cfg, eta, epsilon=r.epsilon or 0.0, transitions=r.transitions, hold=r.hold)
        cond = ctrls_conditioning(cfg, bb, self.model, self.state_prompt, self.mask) if r.ctrls else None
        return sample(bb, [e[0] for e in enc], n, params, conditioning=cond, seeds=list(seeds),
                      prompt_starts=[e[1] for e in enc], read_states=self.model)


def load_run(profile: str = "demo", run_dir: str | Path | None = None, overrides: Sequence[str] = ()) -> LoadedRun:
    """The finished pretraining of ``profile`` (its first backbone x dataset) under ``run_dir`` (default the
    repository's ``runs``), with ``overrides`` as the run was made with; a ``PretrainError`` naming what is missing."""
    from ctrls.config.overrides import parse_overrides
    from ctrls.stages.common import backbone_for
    from ctrls.stages.pretrain import check_fitted, load_pretrained, pretrain_stages
    from ctrls.stages.state_prompt import pair_state_prompt

    root = Path(__file__).resolve().parents[2]
    run_dir = Path(run_dir) if run_dir is not None else root / "runs"
    cfg = load_config(profile, {**parse_overrides(list(overrides)), "run_dir": str(run_dir.resolve())})
    pc = cfg.for_pair(*cfg.pairs()[0])
    check_fitted(pc, "sampling")
    bb = backbone_for(pc)
    model = load_pretrained(pc, bb)
    sp, mask = pair_state_prompt(pc, bb, model, pretrain_stages(pc))
    return LoadedRun(pc, bb, model, sp, mask)


def sample(what, *args, **kwargs):
    """``ctrls.sample``: with a :class:`LoadedRun` (``ctrls.sample(run, questions, row="eps=0.1")``), its
    :meth:`LoadedRun.sample`, which decodes under the run's own conditioning (the state prompt, the adapter, or
    Base); with a backbone, ``ctrls.generate.sampling.sample`` (prompts, n, ``SampleParams``, an explicit
    conditioning)."""
    if isinstance(what, LoadedRun):
        return what.sample(*args, **kwargs)
    from ctrls.generate.sampling import sample as decode

    return decode(what, *args, **kwargs)


__all__ = ["LoadedRun", "load_run", "sample"]
