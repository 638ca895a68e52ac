"""Byte-level BPE tokenizer (``tokenizers``), trained locally and deterministically.

Target and drafters share it. ``EOT`` separates documents. Sentence-end tokens (used by the
block scheduler and the traces) are defined here, once: a token whose decoded text ends with
'.', '!', '?' or a newline.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from control.errors import DSparkError

EOT = "<|endoftext|>"
SENTENCE_END_CHARS = (".", "!", "?", "\n")


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """A byte-level BPE tokenizer with ``vocab_size`` entries trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        min_frequency=2,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    p = Path(path)
    if not p.is_file():
        raise DSparkError(f"tokenizer file missing: {p}")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise DSparkError(f"tokenizer file {p} is unreadable: {str(e).splitlines()[0]}") from None


def sentence_end_ids(tok) -> frozenset[int]:
    """Ids of the tokens whose decoded text ends a sentence ('.', '!', '?' or a newline)."""
    ends = set()
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i])
        if text and text.endswith(SENTENCE_END_CHARS):
            ends.add(i)
    return frozenset(ends)
