"""tools/count_sentences.py: which functions count as returning English assembled from f-strings."""

from tools.count_sentences import count, sentence_functions

SOURCE = '''
def sentence(x) -> str:
    return f"The estimate is {x:+.1f} points above the base model."

def number(x) -> str:
    return f"{x:+.1f} [{x:.1f}]"

def checked(x):
    if x < 0:
        raise ValueError(f"the value {x} is below zero here")
    return x

def joined(parts):
    out = [f"seed {p} ran with the state prompt" for p in parts]
    return " ".join(out)

def html(x) -> str:
    return f'<td class="num big cell">{x}</td>'

def outer() -> int:
    def inner() -> str:
        return f"this one is counted on its own"
    return 1
'''


def test_the_rule_counts_sentences_not_numbers_messages_or_markup():
    assert [name for _, name in sentence_functions(SOURCE)] == ["sentence", "joined", "inner"]


def test_the_packages_are_counted():
    found = count()
    assert set(found) == {"ctrls/report", "bench/gpu"}
    assert all(rel.endswith(".py") for rows in found.values() for rel, _, _ in rows)
