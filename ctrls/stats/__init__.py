"""Statistics: rates, pass@k, intervals, paired tests and sizes chosen by power.

Floor 1 (above ``ctrls.errors``): imports nothing else of ctrls, only numpy, scipy and pandas.

- ``metrics``: pass@k, Succ., bootstrap and Newcombe intervals, Holm, the interval formatter;
- ``power``: Wilson and Newcombe intervals, McNemar, minimal detectable differences;
- ``sizing``: what the demo's sizes can detect, chosen before a run;
- ``agreement``: kappa of steps that follow their drawn state, against coincidence and the independent-chain null;
- ``paired``: paired pass@k differences of two rows on the same questions;
- ``meta``: random-effects pooling over training runs, its prediction interval, a two-stage bootstrap, power.

Add an estimator here when it takes arrays and returns numbers; a table of the book goes in ``ctrls.report``.
"""
