"""The notebook runner's post-processing of executed notebooks."""
import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from ctrls.cli import settle_streams


def test_settle_streams_keeps_each_progress_bar_final_state(tmp_path):
    bar = ["\rload:   0%| 0/2", "\rload:  50%| 1/2", "\rload: 100%| 2/2", "\n",
           "\rtrain:   0%| 0/3", "\rtrain: 100%| 3/3   ", "\rtrain: 100%| 3/3", "\n"]
    cell = new_code_cell("x", outputs=[new_output("stream", name="stderr", text=t) for t in bar]
                         + [new_output("stream", name="stdout", text="a\nb\n"),
                            new_output("display_data", data={"text/plain": "table"}),
                            new_output("stream", name="stdout", text="c\r\n"),
                            new_output("stream", name="stdout", text="d\n")])
    path = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[cell, new_code_cell("y")]), str(path))

    settle_streams(path)

    outs = nbformat.read(str(path), as_version=4).cells[0].outputs
    assert [o.output_type for o in outs] == ["stream", "stream", "display_data", "stream"]
    assert outs[0].name == "stderr" and outs[0].text == "load: 100%| 2/2\ntrain: 100%| 3/3\n"
    assert outs[1].text == "a\nb\n"  # plain output untouched
    assert outs[2].data["text/plain"] == "table"
    assert outs[3].text == "c\nd\n"  # consecutive outputs of one stream are joined
