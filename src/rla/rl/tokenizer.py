"""A character-level tokenizer for the synthetic tasks: one character, one token.

Why characters: the tasks are digit arithmetic and lists of numbers, where a BPE vocabulary would
merge digits unpredictably and make the response length depend on the tokenizer. With one token a
character, a task states its response length in tokens exactly, and the difficulty knob maps
directly onto the sequence length at which RoPE drift and sequence-level mismatch are measured.

It is a ``tokenizers`` WordLevel model over single characters, wrapped as a transformers fast
tokenizer, so ``save_pretrained`` / ``from_pretrained`` (and ``AutoTokenizer``) work on a local
folder with no hub access. Encoding prepends ``<bos>``; padding is on the left (generation
pads prompts on the left). Characters outside the vocabulary map to ``<unk>``;
``check_text`` raises on them instead.
"""

from __future__ import annotations

import string

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

__all__ = ["SPECIAL_TOKENS", "CHARACTERS", "build_tokenizer", "load_tokenizer", "check_text", "char_table"]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# digits, the operators and separators the tasks write, space, newline, lowercase letters
CHARACTERS = tuple(string.digits + "+-*=,;|:>< \n" + string.ascii_lowercase)


def build_tokenizer(model_max_length: int = 1 << 16):
    """The character tokenizer as a transformers ``PreTrainedTokenizerFast`` (52 tokens).

    Ids: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then ``CHARACTERS`` in order. A model's
    ``vocab_size`` should be padded above ``len(tokenizer)`` (``rla.models`` uses 64).
    """
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # every character is its own "word"; Fuse joins decoded tokens with no separator
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=model_max_length,
    )


def load_tokenizer(path):
    """Load a tokenizer saved by ``save_pretrained`` from a local folder (never the hub)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)


def check_text(text: str) -> None:
    """Raise ``ValueError`` naming the characters of ``text`` that the vocabulary lacks."""
    bad = sorted(set(text) - set(CHARACTERS))
    if bad:
        raise ValueError(f"characters outside the rla character vocabulary: {bad!r}")


def char_table(tokenizer) -> np.ndarray | None:
    """A byte -> token id table (256 entries, ``<unk>`` for the rest) if ``tokenizer`` gives one
    token per character of ``CHARACTERS``, else None. Cached on the tokenizer.

    SFT batches are built with it (``table[bytes]``), about 20x faster than the tokenizer's own
    call, which goes through a regex split per character; the result is the same ids.
    """
    cached = getattr(tokenizer, "_rla_char_table", False)
    if cached is not False:
        return cached
    text = "".join(CHARACTERS)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    table = None
    if len(ids) == len(text) and tokenizer.unk_token_id is not None and tokenizer.unk_token_id not in ids:
        table = np.full(256, tokenizer.unk_token_id, dtype=np.int64)
        table[np.frombuffer(text.encode("ascii"), np.uint8)] = ids
    try:
        tokenizer._rla_char_table = table
    except AttributeError:
        pass
    return table
