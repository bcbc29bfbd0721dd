"""Each notebook figure's alt text describes it: MyST-NB writes an output image without alt, and the HTML
writer then falls back to the image's file name (a hash under ``_images/``), which a screen reader reads out.

Connected to ``doctree-read``: an image with no alt takes the text of the caption that follows it
(``ctrls.report.plots.show`` writes "**Figure B2.1.** ..." as the next output), without the caption's closing
"Drawn by ..." sentence, which names code and files rather than the figure. Images with an alt keep it.
"""
import re

from docutils import nodes

CAPTION = re.compile(r"^Figure B\d+\.\d+\.\s")


def caption_alt(text: str) -> str:
    """The alt text of a caption: its words up to "Drawn by", with "Figure B2.1." as "Figure B2.1:"."""
    text = " ".join(text.split()).split(" Drawn by ")[0]
    return re.sub(r"^(Figure B\d+\.\d+)\.\s", r"\1: ", text)


def set_alts(app, doctree) -> None:
    for img in list(doctree.findall(nodes.image)):
        if img.get("alt"):
            continue
        after = img.next_node(nodes.paragraph, ascend=True)  # the next paragraph in the page: the caption
        if after is not None and CAPTION.match(after.astext()):
            img["alt"] = caption_alt(after.astext())


def setup(app):
    app.connect("doctree-read", set_alts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
