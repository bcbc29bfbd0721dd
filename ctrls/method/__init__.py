"""The paper's method, as algorithms on tensors: one module per concept, named as in the paper.

Floor 3: imports ``ctrls.errors``, ``ctrls.stats`` and ``ctrls.data`` only; never the config or a run directory.

- ``backbone``: the frozen LLM mu and its hidden states (Sec. 5);
- ``spectral``: spectral embeddings of each step (Eq. 3-4); ``states``: k-means states (Eq. 5);
- ``policy``: the transition model, Dirichlet policy and epsilon-greedy (Eq. 6-7, 13);
- ``adapter``: the U-Net adapter P_omega (Eq. 8); ``model``: CTRLS = backbone + states + policy + adapter;
- ``elbo``: the pretraining objective (Eq. 9-12); ``reinforce``: the REINFORCE loss (Eq. 14-16);
- ``controls``: does the state steer the step (teacher-forced controls); ``streams``: counter-based random numbers.

Each module cites its equation in its docstring and tags the line that computes it.
"""
