"""The controlled study: a synthetic latent Markov chain where the right answer is known.

Floor 6: imports the config and the method; its figures live in ``ctrls.report.synthetic_figures``.

- ``chain``: the chain MDP, rollouts, transition recovery and the RL runs' summaries;
- ``claims``: what the study claims, each with its test.
"""
