"""Scripted decoding: the engine's token draw replaced by each row's script, every draw's log P recorded."""
import pytest
import torch


@pytest.fixture
def scripted(monkeypatch):
    """``run(bb, prompts, scripts, params, **sample_kw) -> (generations, logp)``: one sample of each prompt whose
    j-th drawn token is ``scripts[i][j]``; ``logp[i][j]`` the decode's log P of that token (EOS included)."""
    import ctrls.generate.sampling as sampling
    from ctrls.method.streams import stream_key

    def run(bb, prompts, scripts, params, **kw):
        seeds = list(range(100, 100 + len(prompts)))
        row_of = {stream_key(s, 0): i for i, s in enumerate(seeds)}
        logp = [[] for _ in prompts]

        def pick(logits, temperature, top_k, keys, counters):
            lp = torch.log_softmax(logits.float(), -1)
            out = []
            for b, (k, c) in enumerate(zip(keys.tolist(), counters.tolist())):
                i = row_of[k]
                logp[i].append(float(lp[b, scripts[i][c]]))
                out.append(scripts[i][c])
            return torch.tensor(out)

        monkeypatch.setattr(sampling, "_pick", pick)
        return sampling.sample(bb, prompts, 1, params, seeds=seeds, **kw), logp

    return run
