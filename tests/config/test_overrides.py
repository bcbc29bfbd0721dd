

def test_an_error_never_writes_out_a_huge_value_first():
    """``short`` of a value that would repr to hundreds of MB stays short and is built from its first items."""
    import tracemalloc

    from ctrls.config.overrides import short

    big = [["x" * 1000] * 1000] * 250  # repr would be about 250 MB
    tracemalloc.start()
    text = short(big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(text) <= 210 and peak < 5 << 20
    assert short("a" * 500).endswith("... (500 characters)") and short({"a": 1}) == "{'a': 1}"
