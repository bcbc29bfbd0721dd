"""The state prompt as a stage option (``state_prompt.use``): fit its vectors after pretraining, and decode
the exploration grid's CTRLS rows with them instead of the last-hidden adapter.

(g) ``state_prompt``, the pretraining stage after the adapter (``runs/<profile>/pretrain/<pair>/state_prompt/``):
m vectors per state (``ctrls.method.state_prompt``) fitted through the frozen backbone on the pretraining
chains, each step under its posterior state (the argmax of Q_phi, as stage (d) assigned it), with early
stopping on the held-out questions' chains (pretraining's validation split); written as safetensors.

The exploration stage, RL and the case studies then decode their CTRLS rows through the engine under the state
prompt (:func:`ctrls_conditioning`, ``ctrls.generate.conditioning.StatePromptConditioning``): a sample's state
chain is drawn before decoding (a_1 ~ pi~(. | s_0), a_{t+1} ~ pi~(. | a_t), hard states, under the position mask
of ``grid.position_floor`` when it is set, ``position_mask_for``), the vectors of a_t enter the KV cache when
step t opens, and the engine's rules hold. Every step's state is read back by Q_phi from an unadapted pass
without the vectors (a re-encode: the decoding pass holds the vectors, so its hidden states are not the
backbone's).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ctrls.config.schema import Config
from ctrls.method.backbone import Backbone
from ctrls.method.state_prompt import Chain, StatePrompt, fit
from ctrls.stages.progress import tqdm
from ctrls.stages.runs import Stage, artifact_error, writing

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

    bar = tqdm(total=sp_cfg.epochs, desc="(g) state prompt", unit="epoch", disable=not progress)  # early stopping ends it short

    def report(row: dict) -> None:
        bar.update(1)
        log.info("state prompt epoch %d: held-out log P per token %.4f", row["epoch"], row["heldout_logp_per_token"])

    if sp_cfg.with_adapter and adapter_model is None:
        raise ValueError("state_prompt.with_adapter: fit_state_prompt needs the pretrained adapter (adapter_model)")
    head = _head(bb, adapter_model) if sp_cfg.with_adapter else None
    sp, info = fit(bb.model, train, held, K, sp_cfg.vectors, sp_cfg.lr, sp_cfg.epochs, sp_cfg.patience, sp_cfg.batch,
                   cfg.seed, on_epoch=report, head=head)
    bar.close()
    tmp = out / (VECTORS + ".tmp")
    with writing(tmp):  # a full disk is a RunDirError naming the file
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


def ctrls_conditioning(cfg: Config, bb: Backbone, model, sp: StatePrompt | None, mask=None, passes=None):
    """How a pair's CTRLS rows are decoded (``ctrls.generate.conditioning``): under the state prompt ``sp`` with
    its position ``mask`` (and the adapter of Eq. 8 as well with ``state_prompt.with_adapter``) when the pair
    fitted one, else through the adapter. ``passes`` (``controllability.PromptPasses``): the prompts' passes
    (s_0, the read-back's KV cache) shared across the calls that decode them."""
    from ctrls.generate.conditioning import AdapterConditioning, StatePromptConditioning

    if sp is None:
        return AdapterConditioning(model)
    return StatePromptConditioning(model, sp, mask=mask, head=_head(bb, model) if cfg.state_prompt.with_adapter else None,
                                   passes=passes, layer=cfg.backbone.hidden_layer)


__all__ = ["VECTORS", "ctrls_conditioning", "fit_state_prompt", "load_state_prompt", "pair_state_prompt",
           "position_mask_for", "prompt_chains"]
