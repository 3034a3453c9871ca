"""From what a user types to the prompt's token ids: the chat template, and checks on the text first.

Each check raises :class:`~refusion.errors.ConfigError` naming the field.
"""

from __future__ import annotations

from typing import Any

from refusion.errors import ConfigError


def encode_prompt(prompt: Any, tokenizer: Any, chat: bool | None, *, allow_special: bool = False) -> list[int]:
    """Token ids of ``prompt`` (text needs a tokenizer; ``chat`` applies its chat template).

    Text holding a special token's text (``"<|endoftext|>"``, the mask token,
    ...) is refused unless ``allow_special``: a tokenizer would turn it into
    that token's id, so typed text could end the prompt or plant masks.
    """
    if not isinstance(prompt, str):
        return prompt
    if tokenizer is None:
        raise ConfigError(
            "`prompt` is text but the model has no tokenizer; pass `tokenizer=` or token ids.", param="prompt"
        )
    use_chat = chat if chat is not None else bool(getattr(tokenizer, "chat_template", None))
    if chat:
        check_chat(tokenizer)
    check_encodable(prompt, "prompt")
    if not allow_special:
        check_no_special_text(prompt, tokenizer, "prompt")
    check_known_characters(prompt, tokenizer)
    if use_chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def check_chat(tokenizer: Any) -> None:
    """Refuse ``chat=True`` for a tokenizer without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "`chat` is on but the tokenizer has no chat template; drop `--chat` (`chat=True`) to feed "
            "the prompt as is, or use a checkpoint whose tokenizer defines `chat_template`.",
            param="chat",
        )


def check_encodable(text: str, field: str) -> None:
    """Refuse text that is not valid Unicode (lone surrogates: undecodable bytes of a command line or file)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"`{field}` is not valid text: character {exc.start} ({text[exc.start]!r}) is not Unicode "
            "(undecodable bytes in the input?); give UTF-8 text.",
            param=field,
        ) from None


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts a tokenizer turns into special-token ids (its special tokens and added tokens marked special)."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False) and getattr(added, "content", None):
            texts.add(added.content)
    return tuple(sorted((t for t in texts if isinstance(t, str) and t), key=len, reverse=True))


def check_no_special_text(text: str, tokenizer: Any, field: str) -> None:
    """Refuse ``text`` (the request field ``field``) if it holds a special token's text, naming the token.

    Callers that mean it (a chat template already rendered to text, a trusted
    file) pass ``allow_special=True`` to :func:`encode_prompt` instead.
    """
    found = [t for t in special_texts(tokenizer) if t in text]
    if found:
        raise ConfigError(
            f"`{field}` holds the text of special token(s) {', '.join(map(repr, found))}, which the "
            "tokenizer would turn into their special ids (an end of text, a mask, ...). Remove them, or "
            "opt in with `allow_special=True` (CLI `--allow-special-tokens`).",
            param=field,
        )


def unknown_token_id(tokenizer: Any) -> int | None:
    """The id a tokenizer gives characters it does not know, or ``None`` if it has no such fallback."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:
        return int(unk)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    name = getattr(getattr(backend, "model", None), "unk_token", None)
    if name:
        found = tokenizer.convert_tokens_to_ids(name)
        return None if found is None else int(found)
    return None


def check_known_characters(prompt: str, tokenizer: Any) -> None:
    """Refuse text whose characters the tokenizer maps to its unknown token, naming them and the alphabet.

    A tokenizer without an unknown-token fallback (byte-level BPE) accepts any text.
    """
    unk = unknown_token_id(tokenizer)
    if unk is None:
        return
    encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    unk_text = tokenizer.convert_ids_to_tokens(unk)
    bad: list[str] = []
    for token, (start, stop) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        piece = prompt[start:stop]
        if token == unk and piece != unk_text:
            bad.extend(ch for ch in piece if ch not in bad)
    if bad:
        vocab = tokenizer.get_vocab()
        singles = sorted(t for t in vocab if len(t) == 1)
        alphabet = f" The tokenizer's alphabet: {''.join(singles)!r}." if 0 < len(vocab) <= 512 else ""
        raise ConfigError(
            f"`prompt` {prompt!r} has characters the tokenizer does not know: "
            f"{', '.join(map(repr, bad))} (they would all become {unk_text!r}).{alphabet}",
            param="prompt",
        )
