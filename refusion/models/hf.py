"""Adapter for any Hugging Face causal LM, ReFusion checkpoints included.

Knows how to find the mask and EOS token ids of a checkpoint and how to call
the network with transformers' own cache (the ``cache=`` keyword from
transformers 5.24, ``past_key_values=`` before: :func:`cache_keyword`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

from refusion.decoding.scores import Scores
from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter, ModelCapabilities
from refusion.models.checks import check_token_ids, token_id
from refusion.plugins import hookimpl
from refusion.validators import shown

MASK_TOKEN_STRINGS = ("<|mask|>", "<mask>", "[MASK]")


def _ids(value: Any) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, int):
        return frozenset({value})
    return frozenset(int(v) for v in value)


def find_mask_token_id(model: Any, tokenizer: Any | None) -> int | None:
    """The mask token id from the model config, else from the tokenizer, else ``None``."""
    mask = getattr(model.config, "mask_token_id", None)
    if mask is not None:
        return int(mask)
    if tokenizer is not None:
        if getattr(tokenizer, "mask_token_id", None) is not None:
            return int(tokenizer.mask_token_id)
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        for text in MASK_TOKEN_STRINGS:
            if text in vocab:
                return int(vocab[text])
    return None


def find_eos_token_ids(model: Any, tokenizer: Any | None) -> frozenset[int]:
    """EOS ids from the generation config, else the model config, else the tokenizer."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        ids = _ids(getattr(source, "eos_token_id", None)) if source is not None else frozenset()
        if ids:
            return ids
    return frozenset()


def eos_ids(given: Any, model: Any, tokenizer: Any | None, vocab_size: int) -> frozenset[int]:
    """The EOS ids an adapter uses: ``given`` (an id or ids, checked against ``vocab_size``; an empty list: none),
    else :func:`find_eos_token_ids`."""
    if given is None:
        return find_eos_token_ids(model, tokenizer)
    listed = [token_id(t) for t in (given if isinstance(given, (list, tuple, set, frozenset)) else [given])]
    if None in listed:  # '1', 1.0 and True are not token ids
        raise ConfigError(
            f"`eos_token_id` must be a token id (an integer) or a list of them (empty: none); got {shown(given)}.",
            param="eos_token_id",
        )
    ids = frozenset(t for t in listed if t is not None)
    check_token_ids("eos_token_id", ids, vocab_size)
    return ids


def cache_keyword(forward: Any) -> str | None:
    """The keyword under which ``forward`` (a network's forward) takes a transformers ``Cache``, or ``None``.

    ``"cache"`` from transformers 5.24; ``"past_key_values"`` in earlier 5.x
    releases and in remote code. Both releases take unknown keywords into
    ``**kwargs`` and ignore them, so passing the wrong one silently decodes
    without the cache.
    """
    try:
        accepted = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    return next((k for k in ("cache", "past_key_values") if k in accepted), None)


class HFCausalLM(ModelAdapter):
    """A transformers ``PreTrainedModel`` with a causal LM head, used as a ReFusion model.

    ``mask_token_id`` and ``eos_token_id`` override what the config and
    tokenizer say. Raises :class:`ConfigError` if no mask token can be found.
    """

    name = "hf-causal"
    capabilities = ModelCapabilities(causal=True, logit_shift=0, kv_cache=True)

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        *,
        mask_token_id: int | None = None,
        eos_token_id: int | Iterable[int] | None = None,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(model.config.vocab_size)
        mask = mask_token_id if mask_token_id is not None else find_mask_token_id(model, tokenizer)
        if mask is None:
            raise ConfigError(
                "The model has no mask token: its config has no `mask_token_id` and its tokenizer no mask token. "
                "Pass `mask_token_id=` (a ReFusion checkpoint sets it in config.json)."
            )
        mask_id = token_id(mask)
        if mask_id is None or not 0 <= mask_id < self.vocab_size:
            raise ConfigError(
                f"`mask_token_id` must be a token id in [0, {self.vocab_size}); got {shown(mask)}.",
                param="mask_token_id",
            )
        self.mask_token_id = mask_id
        self.eos_token_ids = eos_ids(eos_token_id, model, tokenizer, self.vocab_size)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        #: the keyword of the network's cache argument (:func:`cache_keyword`)
        self._cache_kw = cache_keyword(model.forward) or "cache"
        self.forwards = 0
        #: decoding preset recommended by the checkpoint (``refusion.json``), used when no preset is named
        self.preset = None

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: torch.dtype | str = "auto",
        device: str | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> HFCausalLM:
        """Load a checkpoint directory (or hub id, where the hub is reachable) with its tokenizer.

        The checkpoint's own code (``auto_map``) runs only with
        ``trust_remote_code=True``; transformers is told either way, so it never
        asks on standard input. Hub kernels (code transformers would fetch from
        ``kernels-community`` on a GPU) are never loaded.
        """
        import inspect

        from transformers import AutoModelForCausalLM

        from refusion.models.files import load_tokenizer, quietly

        own = [n for n, p in inspect.signature(cls.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY]
        adapter_kwargs = {k: kwargs.pop(k) for k in own if k in kwargs}
        model = quietly(
            AutoModelForCausalLM.from_pretrained,
            path,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            use_kernels=False,
            **kwargs,
        )
        if device is not None:
            model = model.to(device)
        return cls(model, load_tokenizer(path, trust_remote_code), **adapter_kwargs)

    @property
    def device(self) -> torch.device:
        device = getattr(self.model, "device", None)
        return device if device is not None else next(self.model.parameters()).device

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def kv_shape(self):
        config = self.model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = getattr(self.model, "dtype", None) or next(self.model.parameters()).dtype
        return config.num_hidden_layers, heads, dim, dtype

    def _inputs(self, position_ids, attention_mask, cache) -> dict[str, Any]:
        """Keyword arguments of a network call (besides ``input_ids``)."""
        return {
            "position_ids": position_ids,
            "attention_mask": attention_mask,
            self._cache_kw: cache,
            "use_cache": True,
        }

    def forward(self, input_ids, position_ids, attention_mask, cache, logits_to_keep=0):
        self.forwards += 1
        out = self.model(
            input_ids=input_ids, logits_to_keep=logits_to_keep, **self._inputs(position_ids, attention_mask, cache)
        )
        logits = out.logits if hasattr(out, "logits") else out[0]
        return logits[:, -logits_to_keep:] if logits_to_keep and logits.shape[1] > logits_to_keep else logits

    @property
    def head(self):
        """``(backbone, LMHead)`` when the network's logits are a plain projection of its backbone's output, else None.

        Found once (:func:`refusion.models.head.find_head`) and checked against
        the network's own logits on a two-token input.
        """
        if not hasattr(self, "_head"):
            from refusion.models.base import exclusive

            with exclusive(self):  # found once, by one thread, with no other forward in between
                if not hasattr(self, "_head"):
                    self._head = self._find_head()
        return self._head

    def _find_head(self):
        from refusion.models.head import find_head

        found = find_head(self.model)
        if found is None:
            return None
        backbone, head = found
        device = self.device
        ids = torch.tensor([[0, min(1, self.vocab_size - 1)]], device=device)
        pos = torch.arange(2, device=device)[None]
        mask = torch.ones(1, 2, dtype=torch.long, device=device)
        with torch.no_grad():
            want = self.model(input_ids=ids, **self._inputs(pos, mask, None)).logits
            hidden = backbone(input_ids=ids, **self._inputs(pos, mask, None)).last_hidden_state
            got = head.logits(hidden)
        tolerance = 1e-3 if want.dtype in (torch.float16, torch.bfloat16) else 1e-5
        if got.shape != want.shape or not torch.allclose(got.float(), want.float(), atol=tolerance, rtol=tolerance):
            return None
        return found

    def scores(self, input_ids, position_ids, attention_mask, cache):
        from refusion.engines.invariant import current as current_invariance

        found = self.head
        if found is None:
            return super().scores(input_ids, position_ids, attention_mask, cache)
        backbone, head = found
        self.forwards += 1
        out = backbone(input_ids=input_ids, **self._inputs(position_ids, attention_mask, cache))
        hidden = out.last_hidden_state
        if hidden.shape[:-1].numel() < head.min_rows and current_invariance() is None:
            # the network's own head multiplies so few rows with another kernel: its logits, not padded projections
            # (under batch invariance every projection is tiled instead)
            return Scores(logits=torch.nn.functional.linear(hidden.to(head.weight.dtype), head.weight, head.bias))
        return Scores(hidden=hidden, head=head)


@hookimpl
def register_model_adapters(register):
    register(HFCausalLM)
