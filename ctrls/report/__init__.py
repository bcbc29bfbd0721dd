"""The book's layer: tables, figures, verdicts and pages built from stored runs and studies.

Floor 8: imports every floor below (the stages' readers included); nothing below imports it.

- ``tables``, ``beside_paper``, ``paper``, ``paper_power``: Tables 1-3, ours beside the paper's;
- ``plots``, ``synthetic_figures``: the figures; ``display``: how a DataFrame shows on a page;
- ``verdicts``, ``scorecard``, ``findings``: claims, their tests and the first page;
- ``studies``, ``mechanism``, ``steered_rl``: readers of the stored mechanism studies (``studies/results``);
- ``cases``, ``setup_check``, ``codeindex``, ``provenance``: the other pages and their banners.

A new page: a notebook in ``notebooks/`` that calls one function here per table or figure.
"""
