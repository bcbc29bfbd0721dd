"""Repository tools: the set-up installer, the byte-code warm-up and the browser check of the built book
(``sitecheck``, which imports nothing of ctrls)."""
