"""Corpus split, prose extraction, tokenizer determinism, sentence-end tokens, n-gram lookup."""

from real import corpus
from real.drafters import NgramDrafter
from real.tokenizer import SENTENCE_END_CHARS, sentence_end_ids, train_tokenizer


def test_split_is_a_pure_function_of_the_path():
    assert corpus.split_of("json/decoder.py") == corpus.split_of("json/decoder.py")
    splits = [corpus.split_of(f"pkg/mod{i}.py") for i in range(2000)]
    frac = {s: splits.count(s) / len(splits) for s in corpus.SPLITS}
    assert 0.86 < frac["train"] < 0.94 and 0.03 < frac["val"] < 0.07


def test_stdlib_files_exclude_tests():
    files = corpus.stdlib_files()
    assert len(files) > 100
    for rel, _ in files:
        parts = rel.split("/")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts)


def test_prose_extracts_docstrings_and_comments():
    src = (
        '"""Module docstring that is long enough to keep."""\n'
        "# a comment that explains the next line in some detail, long enough\n"
        "x = 1\n"
        "def f():\n    '''Function docstring, also long enough.'''\n    return 2\n"
    )
    prose = corpus.prose_of(src)
    assert "Module docstring" in prose and "Function docstring" in prose
    assert "a comment that explains" in prose and "x = 1" not in prose


def test_tokenizer_training_is_deterministic_and_sentence_ends_follow_the_rule():
    texts = [corpus.prose_of(t) for _, t in corpus.stdlib_files()[:40]]
    a, b = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert a.to_str() == b.to_str()
    ends = sentence_end_ids(a)
    for i in range(a.get_vocab_size()):
        assert (i in ends) == a.decode([i]).endswith(SENTENCE_END_CHARS)
    assert a.token_to_id(".") in ends


def test_ngram_lookup_copies_the_latest_match():
    d = NgramDrafter(max_ngram=3)
    toks = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert d.lookup(toks, 2) == [7, 8]  # latest earlier occurrence of (1, 2, 3)
    assert d.lookup([4, 5, 6], 3) == []


def test_ngram_lookup_continues_a_repeating_stretch():
    """A match whose continuation runs into the present continues with the same period."""
    d = NgramDrafter(max_ngram=3)
    toks = [5, 1, 2, 3, 1, 2, 3]
    assert d.lookup(toks, 2) == [1, 2]
    assert d.lookup(toks, 7) == [1, 2, 3, 1, 2, 3, 1]
    assert d.lookup([4, 4], 3) == [4, 4, 4]  # period 1


def test_mixed_prompt_set_alternates_code_and_prose():
    import dataclasses

    from real.store import CHECKPOINT_DIR
    from real.tokenizer import load_tokenizer
    from real.tracing import PromptSetConfig, make_prompts

    tok = load_tokenizer(CHECKPOINT_DIR / "tokenizer.json")
    cfg = PromptSetConfig(
        workload="mixed",
        split="test",
        n_prompts=5,
        prompt_tokens_min=16,
        prompt_tokens_max=32,
        seed=3,
    )
    mixed = make_prompts(cfg, tok)
    code = make_prompts(dataclasses.replace(cfg, workload="code", n_prompts=3), tok)
    prose = make_prompts(dataclasses.replace(cfg, workload="prose", n_prompts=2), tok)
    assert mixed == [code[0], prose[0], code[1], prose[1], code[2]]
