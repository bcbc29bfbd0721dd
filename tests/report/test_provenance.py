"""A page says once, in one note, which stored result it reads, from which commit and device, or
that the checkout lacks it; never in its sentences, and never with a build path."""
from __future__ import annotations

import json

from ctrls.report import provenance


def test_the_stored_note_names_file_commit_and_device(tmp_path):
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "a.json").write_text(json.dumps({"commit": "60c5c21", "machine": {"cpu": "AMD EPYC", "threads": 1}}))
    (tmp_path / "studies" / "b.json").write_text(json.dumps({"commit": "b7f6c4f", "machine": "AMD EPYC; 2 cores"}))
    (tmp_path / "studies" / "g.json").write_text(json.dumps({"environment": {"gpu": "NVIDIA H200"}}))
    note = provenance.stored_note({"studies/a.json": "the K sweep", "studies/b.json": "the K sweep",
                                   "studies/g.json": "GPU hours", "studies/missing.json": "the concentration"}, tmp_path)
    assert note.startswith(":::{admonition} Where this page's stored results come from\n:class: note\n")
    assert "| `studies/a.json` | the K sweep | `60c5c21` | CPU (AMD EPYC, 1 thread) |" in note
    assert "| `studies/b.json` | the K sweep | `b7f6c4f` | AMD EPYC; 2 cores |" in note
    assert "| `studies/g.json` | GPU hours | — | NVIDIA H200 |" in note and "not recorded" not in note
    assert "| `studies/missing.json` | the concentration | not stored: its study makes it | — |" in note
    assert "They come from 2 different commits." in note
    assert str(tmp_path) not in note  # files are named from the repository's root, never by a build path
    assert provenance.stored_note([], tmp_path) == ""
    plain = provenance.stored_note(["studies/a.json"], tmp_path)
    assert "| stored result | commit | device |\n|---|---|---|" in plain
    (tmp_path / "studies" / "h.json").write_text(json.dumps({"environment": {"gpu": "NVIDIA H200"}}))
    env = {"gpu": "NVIDIA H100", "git_commit": "d116c06" + "a" * 33}
    (tmp_path / "studies" / "e.json").write_text(json.dumps({"environment": env}))
    assert "| `studies/e.json` | `d116c06` | NVIDIA H100 |" in provenance.stored_note(["studies/e.json"], tmp_path)
    none = provenance.stored_note(["studies/h.json"], tmp_path)  # no file records its commit: no commit column
    assert "| stored result | device |\n|---|---|\n| `studies/h.json` | NVIDIA H200 |" in none


def test_the_pretraining_page_lists_every_stored_study_once():
    from ctrls.report import studies

    rels = [*studies.SCALING_RESULTS, studies.GENERATION_RESULT, studies.CONCENTRATION_RESULT, *studies.INJECTION_RESULTS,
            studies.STATES_RESULT, studies.FUSION_RESULT]
    note = provenance.stored_note(rels)
    assert all(f"`{r}`" in note for r in rels) and note.count("| `studies/") == len(set(rels))


def test_the_banner_names_the_conditioning_of_the_ctrls_rows():
    """The demo decodes its CTRLS rows under the state prompt and its position mask, smoke (and an override)
    through the adapter: every page's banner says which, with the settings that matter."""
    from ctrls.config.schema import load_config
    from ctrls.report.provenance import conditioning_name, provenance

    demo, smoke = load_config("demo"), load_config("smoke")
    assert "conditioned by the state prompt (2 vectors per state, position mask at floor 0.05)" in provenance(demo)
    assert "conditioned by the last-hidden adapter (our variant of Eq. 8)" in provenance(smoke)
    off = load_config("demo", ["state_prompt.use=false", "grid.position_floor=0"])
    assert conditioning_name(off) == "the adapter" and conditioning_name(demo) == "the state prompt"
    both = load_config("demo", ["state_prompt.with_adapter=true", "state_prompt.vectors=3"])
    assert "(3 vectors per state, position mask at floor 0.05, with the adapter)" in provenance(both)
