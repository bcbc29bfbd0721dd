"""Pretraining stages (a) and (b) (Alg. 1, lines 1-3): sample chains of thought from the frozen
backbone and keep the correct ones (with the reference solutions), then cache each kept step's
hidden states. Resumable question by question: a question counts once its ``_end`` row is on disk.
"""
from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path

import pandas as pd
import torch

from ctrls.config.schema import Config
from ctrls.data.answers import grade
from ctrls.data.problems import Problem
from ctrls.data.prompts import (
    check_prompts,
    encode_prompt,
    encode_solution,
    final_answer_line,
    model_positions,
    newline_token_ids,
    split_steps,
    step_spans,
)
from ctrls.method.backbone import Backbone
from ctrls.stages.common import sample_params, save_torch
from ctrls.stages.progress import tqdm
from ctrls.stages.runs import (
    ArtifactError,
    UnsafeArtifactError,
    append_jsonl,
    artifact_error,
    file_name,
    load_torch,
)

log = logging.getLogger(__name__)


class PretrainError(RuntimeError):
    pass


def collect(cfg: Config, bb: Backbone, problems: list[Problem], out: Path, progress: bool = True) -> dict:
    """Sample CoTs per training question; keep the correct ones; add reference solutions."""
    unknown = set(cfg.pretrain.sources) - {"samples", "reference"}
    if unknown or not cfg.pretrain.sources:
        raise PretrainError(f"pretrain.sources must be a non-empty subset of [samples, reference], got {cfg.pretrain.sources}")
    path = out / "trajectories.jsonl"
    # here, not at the top: the engine loads transformers, which pages that only read results skip
    from ctrls.generate.sampling import sample
    from ctrls.stages.distributed import world

    w = world()
    if w.is_main:
        _drop_uncommitted(path)
    w.barrier()
    done = _done_questions(path)
    tok = bb.tokenizer
    n = cfg.pretrain.samples_per_question
    params = sample_params(cfg, cfg.pretrain.temperature)
    per_chunk = max(1, cfg.sampling.batch_size // max(n, 1))
    # data parallel: each round covers the next `size * per_chunk` questions, every rank sampling its
    # contiguous block of them (perhaps empty) so that the gathers line up; gathered in rank order,
    # the rows rank 0 appends come in the single-process order
    span = per_chunk * w.size
    bar = tqdm(total=len(problems), desc="(a) collect CoTs", unit="q", disable=not (progress and w.is_main))
    for lo in range(0, len(problems), span):
        chunk = w.shard(problems[lo:lo + span])
        todo = [p for p in chunk if p.id not in done]
        rows = []
        gens = [[] for _ in todo]
        if todo and "samples" in cfg.pretrain.sources and n > 0:
            enc = [encode_prompt(tok, p.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for p in todo]
            # a prompt that does not fit the model's positions with its new tokens is refused, not decoded
            check_prompts([e[0] for e in enc], params.max_new_tokens, model_positions(bb),
                          [f"the prompt of training question {p.id!r}" for p in todo])
            # one seed per question: a resumed or sharded run regenerates exactly the same samples
            gens = sample(bb, [e[0] for e in enc], n, params, seeds=[_question_seed(cfg.seed, p.id) for p in todo])
        for p, gs in zip(todo, gens):
            for g in gs:
                gr = grade(g.text, p.answer)
                rows.append({"qid": p.id, "source": "samples", "sample_index": g.sample_index,
                             "solution_ids": g.token_ids, "steps": g.steps, "valid": gr.valid,
                             "correct": gr.correct, "pred": gr.pred, "kept": gr.correct and len(g.steps) > 0,
                             "finish": g.finish})
            if "reference" in cfg.pretrain.sources:
                steps = reference_steps(p, cfg.prompt.max_steps)
                rows.append({"qid": p.id, "source": "reference", "sample_index": -1,
                             "solution_ids": encode_solution(tok, steps), "steps": steps, "valid": True,
                             "correct": True, "pred": p.answer, "kept": True, "finish": "reference"})
            rows.append({"qid": p.id, "source": "_end", "sample_index": -2})  # commits the question (after its rows)
        rows, sizes = w.gather_list(rows), w.gather(len(chunk))
        if rows and w.is_main:
            append_jsonl(path, rows)
        bar.update(sum(sizes))
    bar.close()
    w.barrier()
    df = read_trajectories(path)
    sampled = df[df.source == "samples"]
    kept = df[df.kept.astype(bool)]
    if kept.empty:
        raise PretrainError("no correct trajectory was collected: raise pretrain.samples_per_question or add "
                            "'reference' to pretrain.sources")
    return {"questions": len(problems), "sampled": len(sampled), "sampled_correct": int(sampled.correct.sum()),
            "acceptance_rate": float(sampled.correct.mean()) if len(sampled) else None,
            "reference": int((df.source == "reference").sum()), "kept": len(kept),
            "sources": list(cfg.pretrain.sources)}


def _question_seed(seed: int, qid: str) -> int:
    return zlib.crc32(f"collect|{seed}|{qid}".encode())


def reference_steps(p: Problem, max_steps: int) -> list[str]:
    """A reference chain's steps: the problem's own steps and one final answer line (not a second one
    where the steps already end with it, as word problems' do); steps beyond T merge into step T, as
    ``split_steps`` does for generations."""
    line = final_answer_line(p.answer)
    own = list(p.steps)
    return split_steps("\n".join(own if own and own[-1].strip() == line else [*own, line]), max_steps)


TRAJ_COLUMNS = ["qid", "source", "sample_index", "solution_ids", "steps", "valid", "correct", "pred", "kept", "finish"]


def _is_end(line: bytes) -> bool:
    if b'"_end"' not in line or not line.endswith(b"\n"):
        return False
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return isinstance(row, dict) and row.get("source") == "_end"


def _drop_uncommitted(path: Path) -> None:
    """Cut the rows after the last committed question (a question whose write a kill cut short) off
    the JSONL, so that redoing that question does not add its rows twice."""
    if not path.exists():
        return
    end = pos = 0
    with open(path, "rb") as f:
        for line in f:
            pos += len(line)
            if _is_end(line):
                end = pos
    if end < pos:
        log.info("%s: dropping %d bytes after the last committed question (a write cut short); "
                 "that question is sampled again", path, pos - end)
        with open(path, "rb+") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())


def _done_questions(path: Path) -> set[str]:
    if not path.exists():
        return set()
    with open(path, "rb") as f:
        return {json.loads(line)["qid"] for line in f if _is_end(line)}


def read_trajectories(path: Path) -> pd.DataFrame:
    """The rows of every committed question, in file order, without the `_end` rows.

    A question's rows are those just before its `_end` row. Rows after the last `_end` (a write cut
    by a kill) are not read. Runs resumed by older versions could also hold such cut rows between
    blocks: rows of another question are dropped, and a row repeated within a block counts once
    (the last). A line that is not JSON inside a committed block is an error naming the line."""
    rows: list[dict] = []
    block: list[tuple[int, dict | None]] = []
    seen: set[str] = set()
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise artifact_error(path, e) from e
    with f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # cut by a kill: uncommitted
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                row = None
            if row is None or row.get("source") != "_end":
                block.append((n, row))
                continue
            bad = [k for k, r in block if r is None]
            if bad:
                raise ArtifactError(f"{path}, line {bad[0]}: not a JSON row; the file is corrupt: delete it "
                                    "and rerun the pretraining stage")
            qid = row["qid"]
            if qid not in seen:
                seen.add(qid)
                mine = {(r["source"], r["sample_index"]): r for _, r in block if r["qid"] == qid}
                rows += mine.values()
            block = []
    return pd.DataFrame(rows, columns=TRAJ_COLUMNS)


def kept_trajectories(collect_dir: Path) -> pd.DataFrame:
    """The kept trajectories of committed questions, in file order."""
    df = read_trajectories(collect_dir / "trajectories.jsonl")
    return df[df.kept.astype(bool)].reset_index(drop=True)


def cache_features(cfg: Config, bb: Backbone, problems: list[Problem], collect_dir: Path, out: Path,
                   progress: bool = True) -> dict:
    """Cache each kept trajectory's step hidden states and each question's: the prompts' shared template
    (``ctrls.generate.decoding.shared_prefix_length``) runs once, each question's own prompt tokens once on a
    copy of its KV cache, and the question's trajectories together on a copy of that. The hidden states
    are those of one pass over prompt and trajectory, up to float rounding (``tests/stages/test_collect.py``)."""
    import copy

    from transformers import DynamicCache

    from ctrls.generate.decoding import shared_prefix_length

    traj = kept_trajectories(collect_dir)
    by_q = {p.id: p for p in problems}
    nl = newline_token_ids(bb.tokenizer)
    n_traj = 0
    order = {p.id: i for i, p in enumerate(problems)}  # question order, whatever order (a) wrote them in
    groups = sorted(traj.groupby("qid", sort=False), key=lambda kv: order.get(kv[0], len(order)))
    prompts = {qid: encode_prompt(bb.tokenizer, by_q[qid].question, cfg.prompt.use_chat_template, cfg.prompt.few_shot)
               for qid, _ in groups}
    L = shared_prefix_length([ids for ids, _ in prompts.values()])
    layer = cfg.backbone.hidden_layer
    template: tuple | None = None  # the shared template's (KV cache, hidden states), run when first needed
    for qid, g in tqdm(groups, desc="(b) hidden states", unit="q", disable=not progress):
        f = shard_file(out, qid)
        if f.exists() and _valid_shard(f, qid, len(g)):
            n_traj += len(g)
            continue
        ids, start = prompts[qid]
        P = len(ids)
        if template is None:
            kv = DynamicCache(config=bb.model.config)
            template = (kv, bb.hidden_states(torch.as_tensor([ids[:L]]), layer=layer, cache=kv)[0].float().cpu()
                        if L else None)
        kv = copy.deepcopy(template[0])
        own = bb.hidden_states(torch.as_tensor([ids[L:]]), layer=layer, cache=kv)[0].float().cpu()  # positions L..P-1
        hp = torch.cat([template[1], own]) if L else own  # the prompt's hidden states
        sols = [list(s) for s in g.solution_ids]
        width = max(len(s) for s in sols)
        batch = torch.full((len(sols), width), bb.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(sols), P + width), dtype=torch.long)
        mask[:, :P] = 1
        for i, s in enumerate(sols):  # right padding: every trajectory's tokens at positions P, P+1, ...
            batch[i, :len(s)] = torch.as_tensor(s)
            mask[i, P:P + len(s)] = 1
        kv.batch_repeat_interleave(len(sols))
        h = bb.hidden_states(batch, mask, layer=layer, cache=kv).float().cpu()
        items = []
        for i, s in enumerate(sols):
            spans = step_spans(s, nl, bb.tokenizer, max_steps=cfg.prompt.max_steps)
            steps = [bb.tokenizer.decode(s[a:b]).strip() for a, b in spans]
            # H[j] is the hidden state at position P-1+j: it predicts solution token j, and
            # H[1+a : 1+b] are the hidden states E_t of the step's own tokens.
            hidden = torch.cat([hp[P - 1:], h[i, :len(s)]])
            items.append({"hidden": hidden.to(torch.float16), "targets": torch.as_tensor(s),
                          "spans": torch.as_tensor(spans, dtype=torch.long).reshape(-1, 2),
                          "steps": steps, "source": g.source.iloc[i], "sample_index": int(g.sample_index.iloc[i])})
        question_hidden = hp[start:P].to(torch.float16)
        tmp = f.with_suffix(".tmp")
        save_torch({"qid": qid, "question_hidden": question_hidden, "trajectories": items}, tmp)
        tmp.replace(f)
        n_traj += len(items)
    return {"trajectories": n_traj, "questions": len(groups)}


def _valid_shard(f: Path, qid: str, n_traj: int) -> bool:
    """Whether a shard written earlier can be reused: it loads, for this question and its trajectories.
    Loaded with ``weights_only=True`` (``ctrls.stages.runs.load_torch``): a shard that would need the full
    unpickler (which could run code) is refused with :class:`UnsafeArtifactError`, never loaded or
    overwritten."""
    try:
        shard = load_torch(f, mmap=True)  # reads the zip index, not the tensors
        ok = shard["qid"] == qid and len(shard["trajectories"]) == n_traj
        why = f"it holds {shard['qid']!r} with {len(shard['trajectories'])} trajectories, expected {qid!r} with {n_traj}"
    except UnsafeArtifactError:
        raise
    except Exception as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        log.warning("features shard %s is unusable (%s): recomputing it", f, why)
    return ok


def shard_file(features_dir: Path, qid: str) -> Path:
    """The feature shard of one question: injective in the id (``ctrls.data.names.file_name``)."""
    return features_dir / f"{file_name(qid)}.pt"


def feature_shards(features_dir: Path) -> list[dict]:
    """Every feature shard, loaded with ``weights_only=True`` (tensors and plain containers only)."""
    return [load_torch(f) for f in sorted(features_dir.glob("*.pt"))]
