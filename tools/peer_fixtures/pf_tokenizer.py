"""The char-level tokenizer shared by the four peer fixtures (same ids everywhere, family-specific spellings).

ids: 0 <|pad|>, 1 <|endoftext|> (EOS), 2 end-of-turn, 3 mask, 4 bos, 5..99 the printable ASCII characters
32..126 in order, 100..127 <|extra_0|>..<|extra_27|>. Characters outside 32..126 have no id (encoding one raises).
"""

from __future__ import annotations

PAD, EOS, EOT, MASK, BOS = 0, 1, 2, 3, 4
FIRST_CHAR, N_CHARS, N_EXTRA = 5, 95, 28
VOCAB = FIRST_CHAR + N_CHARS + N_EXTRA  # 128
MODEL_MAX_LENGTH = 512

SPELLINGS = {
    # family: (end-of-turn, mask, bos)
    "llada": ("<|eot_id|>", "<|mdm_mask|>", "<|startoftext|>"),
    "dream": ("<|im_end|>", "<|mask|>", "<|beginoftext|>"),
    "sdar": ("<|im_end|>", "<|MASK|>", "<|beginoftext|>"),
    "refusion": ("<|im_end|>", "<|mask|>", "<|beginoftext|>"),
    "diffusion_gemma": ("<end_of_turn>", "<mask>", "<bos>"),
    "fast_dllm_v2": ("<|im_end|>", "|<MASK>|", "<|beginoftext|>"),
}


def vocabulary(family: str) -> list[str]:
    eot, mask, bos = SPELLINGS[family]
    toks = ["<|pad|>", "<|endoftext|>", eot, mask, bos]
    toks += [chr(c) for c in range(32, 127)]
    toks += [f"<|extra_{i}|>" for i in range(N_EXTRA)]
    assert len(toks) == VOCAB and len(set(toks)) == VOCAB
    return toks


def special_ids() -> list[int]:
    return [PAD, EOS, EOT, MASK, BOS] + list(range(FIRST_CHAR + N_CHARS, VOCAB))


def encode_chars(text: str) -> list[int]:
    """Pure-python reference encoding (used for the prompts; checked against the saved tokenizer)."""
    out = []
    for ch in text:
        if not 32 <= ord(ch) <= 126:
            raise ValueError(f"character {ch!r} has no id in the fixture vocabulary")
        out.append(FIRST_CHAR + ord(ch) - 32)
    return out


def save_tokenizer(family: str, directory: str) -> None:
    """Write tokenizer.json (tokenizers WordLevel) + tokenizer_config.json + special_tokens_map.json."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    toks = vocabulary(family)
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(toks)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(toks[i], special=True, normalized=False) for i in special_ids()])
    eot, mask, bos = SPELLINGS[family]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token=mask,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(directory)
    # transformers 4 writes the class name without its "Fast" suffix; published checkpoints (e.g. LLaDA) spell it
    # "PreTrainedTokenizerFast". Rewrite that one field, keeping the key order and layout transformers wrote.
    import json
    import os

    path = os.path.join(directory, "tokenizer_config.json")
    with open(path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def check_tokenizer(family: str, directory: str) -> None:
    """Load with transformers' AutoTokenizer (offline) and check ids, specials and a round trip."""
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    eot, mask, bos = SPELLINGS[family]
    assert type(t).__name__ == "PreTrainedTokenizerFast", type(t)
    assert len(t) == VOCAB, len(t)
    assert t.encode("ab", add_special_tokens=False) == [70, 71]
    assert t.encode("ab") == [70, 71], "the tokenizer must not add bos/eos"
    sample = "Hi there, fuse slots! ~{}"
    assert t.encode(sample) == encode_chars(sample)
    assert t.decode(encode_chars(sample)) == sample
    assert (t.pad_token_id, t.eos_token_id, t.mask_token_id, t.bos_token_id) == (PAD, EOS, MASK, BOS)
    assert t.convert_tokens_to_ids(eot) == EOT
    assert t.encode(mask + "a" + eot) == [MASK, 70, EOT]
    assert t.decode([70, MASK, 71, EOS], skip_special_tokens=True) == "ab"
    assert t.convert_ids_to_tokens(list(range(100, 128)))[-1] == "<|extra_27|>"
