"""A character-level tokenizer for the synthetic tasks, as a transformers fast tokenizer.

One token per character plus three special tokens. It is saved next to the
model (``tokenizer.json``) and loads offline with ``AutoTokenizer``.
"""

from __future__ import annotations

import string

PAD, EOS, MASK = "<|pad|>", "<|endoftext|>", "<|mask|>"
CHARACTERS = string.ascii_lowercase + string.digits + " +-=:,"
SPECIALS = (PAD, EOS, MASK)


def char_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`CHARACTERS` with pad, EOS and mask tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + tuple(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        mask_token=MASK,
        model_max_length=128,
        clean_up_tokenization_spaces=False,
    )
