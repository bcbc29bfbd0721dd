"""Per-step time of on-policy RL (Algorithm 2) on the CPU with SmolLM2-135M: sampling vs update.

One REINFORCE step = sampling G trajectories for each question with the state-aware engine,
grading them, and the policy update (log-densities, entropy, backward, Adam). The last line is a
JSON object with the split.
"""
import json
import time

import torch

from ctrls.answers import grade
from ctrls.backbone import load_backbone
from ctrls.config import load_config
from ctrls.policy import TransitionPolicy
from ctrls.prompts import prompt_ids
from ctrls.rl import Trajectory, reinforce_loss
from ctrls.sampling import SampleParams, sample, seeded
from sampling import QUESTIONS, random_ctrls


def main(steps=3, G=8):
    cfg = load_config("demo")
    bb = load_backbone(cfg.backbone.name)
    model = random_ctrls(bb)
    policy: TransitionPolicy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.rl.lr)
    prompts = [prompt_ids(bb.tokenizer, q, few_shot=0) for q in QUESTIONS]
    params = SampleParams(temperature=0.7, max_new_tokens=cfg.sampling.max_new_tokens, epsilon=0.1, batch_size=128)
    t_sample = t_grade = t_update = 0.0
    tokens = 0
    for step in range(steps):
        t = time.perf_counter()
        gens = sample(bb, prompts, G, params, model=model, generator=seeded(step))
        t_sample += time.perf_counter() - t
        t = time.perf_counter()
        trajs = [Trajectory(g.states, float(grade(g.text, "0").correct), i) for i, gs in enumerate(gens) for g in gs]
        t_grade += time.perf_counter() - t
        tokens += sum(g.n_tokens for gs in gens for g in gs)
        t = time.perf_counter()
        loss, _ = reinforce_loss(policy, trajs, 0.1, 0.01)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        t_update += time.perf_counter() - t
    total = t_sample + t_grade + t_update
    print(f"{steps} RL steps, {len(prompts)} questions x G={G} trajectories, {tokens / steps:.0f} tokens per step")
    print(f"per step: sampling {t_sample / steps:.2f} s ({t_sample / total:.1%}), grading {t_grade / steps:.3f} s "
          f"({t_grade / total:.1%}), update {t_update / steps:.4f} s ({t_update / total:.2%})")
    print(json.dumps({"sampling_s": round(t_sample / steps, 3), "grading_s": round(t_grade / steps, 4),
                      "update_s": round(t_update / steps, 5), "sampling_fraction": round(t_sample / total, 4)}))


if __name__ == "__main__":
    main()
