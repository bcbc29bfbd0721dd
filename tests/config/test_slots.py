"""A stage's slot: its plain directory for the first run made there, ``<dir>@<key>`` beside it for another key's."""
from ctrls.config.slots import beside, slot_dir, slotted, split_slot, stored_key


def test_a_run_of_another_key_is_placed_beside_the_plain_directory(tmp_path):
    plain = tmp_path / "smoke" / "exploration"
    assert slot_dir(plain, "k1") == plain  # nothing there yet: the plain directory
    plain.mkdir(parents=True)
    (plain / "key").write_text("k1")
    assert stored_key(plain) == "k1"
    assert slot_dir(plain, "k1") == plain
    assert slot_dir(plain, "k2") == tmp_path / "smoke" / "exploration@k2"
    beside(plain, "k2").mkdir()
    (plain / "key").unlink()  # the plain run removed: the run beside is still found by its key
    assert slot_dir(plain, "k2") == beside(plain, "k2")


def test_outputs_outside_the_directory_carry_the_slot_and_names_split_back(tmp_path):
    plain = tmp_path / "pretrain" / "b__d" / "adapter"
    ckpt = tmp_path / "pretrain" / "b__d" / "checkpoint"
    assert slotted(ckpt, plain, plain) == ckpt
    assert slotted(ckpt, plain, beside(plain, "abc")) == ckpt.with_name("checkpoint@abc")
    assert split_slot("adapter@abc") == ("adapter", "abc") and split_slot("adapter") == ("adapter", None)


def test_a_key_file_that_is_a_link_is_not_read(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("k1")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "key").symlink_to(target)
    assert stored_key(tmp_path / "a") is None
