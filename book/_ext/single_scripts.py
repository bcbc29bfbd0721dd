"""Each page's scripts once: Jupyter Book 1.0.4 on Sphinx 7.4 registers sphinx-thebe's and
sphinx-togglebutton's inline configuration scripts twice (once in the registry, once on the
builder), and the second ``const THEBE_JS_URL`` is a console error on every page.

Connected to ``html-page-context``, it keeps the first of each identical script (same file, or both inline,
with the same attributes and body), in order. Nothing else on the page changes.
"""


def _key(js):
    attributes = getattr(js, "attributes", {}) or {}
    filename = getattr(js, "filename", js) or ""  # an inline script is filename None in one list, "" in the other
    return (str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def drop_repeated_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        key = _key(js)
        if key not in seen:  # the first copy keeps its place: order matters to the theme's scripts
            seen.add(key)
            kept.append(js)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", drop_repeated_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
