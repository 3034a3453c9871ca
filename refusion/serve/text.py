"""From the growing committed prefix to text deltas: ``max_tokens``, stop strings, unfinished characters.

Knows nothing about HTTP. ``StreamText.feed`` takes the tokens that extend
the contiguous committed prefix and returns the text that may be shown now;
text that could still become a stop string, or an unfinished UTF-8
character, is held back until the next tokens settle it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class StreamText:
    """The answer's text as its prefix grows, cut at the first stop string, at EOS or after ``max_tokens`` tokens.

    ``finish_reason`` becomes ``"stop"`` (EOS or a stop string) or
    ``"length"`` (``max_tokens`` reached); after that ``feed`` returns ``""``.
    ``tokens`` are the answer's tokens: after a stop string, only those of
    the text returned (what ``usage.completion_tokens`` counts).
    """

    def __init__(self, tokenizer: Any, eos_ids: Iterable[int], *, max_tokens: int, stops: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.max_tokens = max_tokens
        self.stops = stops
        self.tokens: list[int] = []
        self.sent = ""
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def feed(self, tokens: Iterable[int]) -> str:
        """The new text that ``tokens`` (the next tokens of the prefix) make showable."""
        if self.done:
            return ""
        for token in tokens:
            self.tokens.append(token)
            if token in self.eos_ids:
                self.finish_reason = "stop"
                break
            if len(self.tokens) >= self.max_tokens:
                self.finish_reason = "length"
                break
        return self._delta(final=self.done)

    def finish(self, reason: str = "length") -> str:
        """The request ended (its answer is complete): the text held back, and the reason if none was set."""
        if self.finish_reason is None:
            self.finish_reason = reason
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        text = self.text_so_far()
        cut = False
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0:
                text, cut = text[:at], True
                self.finish_reason = "stop"
                final = True
        if cut:
            self._keep_tokens_of(text)
        if not final:
            text = text[: len(text) - self._held_back(text)]
        if not text.startswith(self.sent):  # later tokens changed how sent bytes decode: sent text stays
            return ""
        delta = text[len(self.sent) :]
        self.sent = text
        return delta

    def _keep_tokens_of(self, text: str) -> None:
        """Drop the tokens past those that make ``text`` (the answer cut before a stop string): the fewest
        leading tokens whose text starts with it (a token holding both the answer's end and the stop's start
        stays). Scans back from the end: only the tokens past the stop are decoded again."""
        n = len(self.tokens)
        while n > 0 and self.tokenizer.decode(self.tokens[: n - 1], skip_special_tokens=True).startswith(text):
            n -= 1
        del self.tokens[n:]

    def text_so_far(self) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def _held_back(self, text: str) -> int:
        """Characters at the end of ``text`` that may not be shown yet."""
        hold = 0
        if text.endswith("\ufffd"):  # an unfinished multi-byte character
            hold = len(text) - len(text.rstrip("\ufffd"))
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        return hold
