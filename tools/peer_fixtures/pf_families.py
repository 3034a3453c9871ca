"""The four peer families: how each is imported, built, saved, probed (logits) and decoded (calls).

Every model is built by the peer's own class, in float32, from `torch.manual_seed(weight_seed)`.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
import types

import pf_common as C
import pf_tokenizer as T
import torch

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, MAXPOS = 64, 2, 4, 2, 128, 512
VOCAB, MASK, EOS, EOT, BOS, PAD = T.VOCAB, T.MASK, T.EOS, T.EOT, T.BOS, T.PAD
PROMPT_TEXTS = ["hello", "abcdefgh", "fuse slots!"]
LOGIT_MASKS = 12


def prompts() -> list[list[int]]:
    out = [T.encode_chars(s) for s in PROMPT_TEXTS]
    assert [len(p) for p in out] == [5, 8, 11]
    return out


class Call:
    """One peer call: `function` id, prompt index, the JSON kwargs, the seed (None = greedy, unseeded), and the
    dtype the model is loaded in (`from_pretrained(..., torch_dtype=...)`, as the authors run it)."""

    def __init__(self, function, prompt, args, seed=None, sampling=False, note="", dtype="float32"):
        self.function, self.prompt, self.args = function, prompt, args
        self.seed, self.sampling, self.note, self.dtype = seed, sampling, note, dtype

    def in_dtype(self, dtype):
        return Call(self.function, self.prompt, self.args, self.seed, self.sampling, self.note, dtype)


class Family:
    name = ""
    class_name = ""
    shard_size = None  # e.g. "150KB" -> sharded save
    shift = False  # Dream's logits are shifted by one
    forbidden = (MASK,)
    #: dtypes every call is made in (the published checkpoints ship in bfloat16; SDAR's script defaults to float16)
    dtypes = ("float32", "bfloat16")
    #: head rows multiplied by `--eos-scale` (opt-in) so that answers end with / contain an EOS
    eos_rows = ()

    def __init__(self, peers: dict):
        self.peers = peers
        self.records = {}

    # subclasses: load(), config(), head(model), published_extras, generation_config, logits_case(), calls(), run()
    def build(self, seed: int, head_scale: float = 1.0, eos_scale: float = 1.0):
        torch.manual_seed(seed)
        model = self.construct()
        with torch.no_grad():
            head = self.head(model)
            if head_scale != 1.0:  # opt-in only (--head-scale); the committed fixtures use 1.0
                head.weight.mul_(head_scale)
            if eos_scale != 1.0:  # opt-in only (--eos-scale): EOS wins at some positions
                for tid in self.eos_rows:
                    head.weight[tid].mul_(eos_scale)
            for tid in self.forbidden:
                head.weight[tid].zero_()
            if getattr(head, "bias", None) is not None:
                raise C.FixtureError("output head has a bias; zeroing a weight row would not silence the token")
        return model.eval()

    def save(self, model, directory: str) -> None:
        from transformers import GenerationConfig

        kw = {"safe_serialization": True}
        if self.shard_size:
            kw["max_shard_size"] = self.shard_size
        model.save_pretrained(directory, **kw)
        for stray in ("generation_config.json",):
            p = os.path.join(directory, stray)
            if os.path.exists(p):
                os.remove(p)
        C.rewrite_config_json(os.path.join(directory, "config.json"), self.published_extras, self.drop_keys)
        GenerationConfig(**self.generation_config).save_pretrained(directory)
        T.save_tokenizer(self.name, directory)
        T.check_tokenizer(self.name, directory)
        for f in os.listdir(directory):
            if f.endswith(".py"):
                raise C.FixtureError(f"a .py file ended up in the fixture folder: {f}")

    drop_keys = ()

    def head(self, model):
        return model.lm_head

    def all_calls(self):
        """Every call in every dtype of :attr:`dtypes`, float32 first."""
        base = self.calls()
        return [c.in_dtype(d) for d in self.dtypes for c in base] + list(self.extra_calls())

    def extra_calls(self):
        return []

    @staticmethod
    def torch_dtype(name):
        return getattr(torch, name)


# =========================================================================== LLaDA
class LLaDA(Family):
    name, class_name = "llada", "LLaDAModelLM"
    published_extras = {
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        }
    }
    generation_config = {"bos_token_id": BOS, "eos_token_id": EOS}

    def load(self):
        fd, ll = self.peers["fast_dllm"], self.peers["llada"]
        pkg = C.synth_package("pf_llada_model", os.path.join(fd, "llada", "model"))
        self.cfg_mod = __import__("pf_llada_model.configuration_llada", fromlist=["x"])
        self.mod = __import__("pf_llada_model.modeling_llada", fromlist=["x"])
        # Fast-dLLM llada/generate.py does `from .model.modeling_llada import LLaDAModelLM`: give it the same
        # (already imported) module -- importing the LLaDA files twice re-runs AutoConfig.register and fails.
        C.synth_package("pf_fdllm_llada", os.path.join(fd, "llada"))
        C.alias_module("pf_fdllm_llada.model", pkg)
        C.alias_module("pf_fdllm_llada.model.modeling_llada", self.mod)
        C.alias_module("pf_fdllm_llada.model.configuration_llada", self.cfg_mod)
        self.fast = __import__("pf_fdllm_llada.generate", fromlist=["x"])
        self.orig = C.load_file("pf_llada_generate", os.path.join(ll, "generate.py"))
        self.records = {
            "config": C.file_record(fd, "llada/model/configuration_llada.py", "NVlabs/Fast-dLLM", "--fast-dllm"),
            "model": C.file_record(fd, "llada/model/modeling_llada.py", "NVlabs/Fast-dLLM", "--fast-dllm"),
            "generate": C.file_record(ll, "generate.py", "ML-GSAI/LLaDA", "--llada"),
            "fast_dllm_generate": C.file_record(fd, "llada/generate.py", "NVlabs/Fast-dLLM", "--fast-dllm"),
        }

    def construct(self):
        cfg = self.cfg_mod.LLaDAConfig(
            d_model=HIDDEN,
            n_heads=HEADS,
            n_kv_heads=KV_HEADS,
            n_layers=LAYERS,
            mlp_hidden_size=INTER,
            mlp_ratio=4,
            max_sequence_length=MAXPOS,
            vocab_size=VOCAB,
            embedding_size=VOCAB,
            block_type="llama",
            block_group_size=1,
            activation_type="silu",
            layer_norm_type="rms",
            layer_norm_with_affine=True,
            rms_norm_eps=1e-5,
            rope=True,
            rope_theta=500000.0,
            rope_full_precision=True,
            alibi=False,
            alibi_bias_max=8.0,
            weight_tying=False,
            include_bias=False,
            include_qkv_bias=False,
            bias_for_layer_norm=False,
            attention_layer_norm=False,
            attention_layer_norm_with_affine=True,
            input_emb_norm=False,
            scale_logits=False,
            multi_query_attention=None,
            flash_attention=False,
            attention_dropout=0.0,
            residual_dropout=0.0,
            embedding_dropout=0.0,
            init_device="meta",
            init_fn="mitchell",
            init_std=0.02,
            init_cutoff_factor=None,
            precision="amp_bf16",
            mask_token_id=MASK,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
        return self.mod.LLaDAModelLM(cfg, init_params=True)

    def head(self, model):
        return model.model.transformer.ff_out

    def reload(self, directory, dtype="float32"):
        return self.mod.LLaDAModelLM.from_pretrained(directory, torch_dtype=self.torch_dtype(dtype)).eval()

    def logits(self, model, ids):
        return model(ids).logits[0], "model(input_ids).logits[0]: plain bidirectional forward, no attention mask"

    def guard_wrappers(self, guard):
        def make(orig):
            def wrapped(logits, temperature):
                out = orig(logits, temperature)
                guard.check_decision(out)
                return out

            return wrapped

        return [(self.orig, "add_gumbel_noise", make), (self.fast, "add_gumbel_noise", make)]

    def calls(self):
        out = []
        base = dict(mask_id=MASK, temperature=0.0, cfg_scale=0.0, remasking="low_confidence")
        specs = [
            ("a", dict(steps=16, gen_length=16, block_length=8), None, False, "2 blocks of 8, 1 token per step"),
            ("b", dict(steps=12, gen_length=24, block_length=8), None, False, "3 blocks of 8, 2 tokens per step"),
            ("c", dict(steps=32, gen_length=32, block_length=32), None, False, "one block of 32, 1 token per step"),
            (
                "d",
                dict(steps=16, gen_length=16, block_length=8, remasking="random"),
                0,
                False,
                "random remasking (torch.rand order), greedy tokens",
            ),
            (
                "e",
                dict(steps=16, gen_length=16, block_length=8, cfg_scale=1.0, attention_mask="ones_like(prompt)"),
                None,
                False,
                "classifier-free guidance; attention_mask=torch.ones_like(prompt) because the peer raises "
                "UnboundLocalError (attention_mask_) without one",
            ),
            (
                "f",
                dict(steps=16, gen_length=16, block_length=8, temperature=0.5),
                0,
                True,
                "Gumbel-max sampling (float64 noise from torch.rand_like)",
            ),
        ]
        for p in range(3):
            for tag, kw, seed, sampling, note in specs:
                args = dict(base)
                args.update(kw)
                out.append(Call("llada.generate", p, args, seed, sampling, f"({tag}) {note}"))
        for fn in ("generate", "generate_with_prefix_cache", "generate_with_dual_cache"):
            for p in range(3):
                common = dict(
                    steps=16, gen_length=16, block_length=8, temperature=0.0, remasking="low_confidence", mask_id=MASK
                )
                for extra, note in (
                    (dict(threshold=0.9), "threshold 0.9"),
                    (dict(threshold=0.5), "threshold 0.5"),
                    (dict(threshold=None), "threshold None: fixed 1 token per step (steps=16)"),
                    (dict(threshold=None, factor=1.0), "factor 1.0 (get_transfer_index_dynamic)"),
                ):
                    if "factor" in extra and "factor" not in inspect.signature(getattr(self.fast, fn)).parameters:
                        continue
                    args = dict(common)
                    args.update(extra)
                    out.append(Call(f"fast_dllm.{fn}", p, args, None, False, note))
        return out

    def run(self, model, call, prompt):
        kw = dict(call.args)
        if kw.get("attention_mask") == "ones_like(prompt)":
            kw["attention_mask"] = torch.ones_like(prompt)
        if call.function == "llada.generate":
            return self.orig.generate(model, prompt, **kw), {}
        fn = getattr(self.fast, call.function.split(".", 1)[1])
        x, nfe = fn(model, prompt, **kw)
        return x, {"nfe": int(nfe)}


# =========================================================================== Dream
class Dream(Family):
    name, class_name, shift = "dream", "DreamModel", True
    eos_rows = (EOS,)
    published_extras = {
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "use_mrope": False,
    }
    generation_config = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS}

    def load(self):
        fd = self.peers["fast_dllm"]
        C.synth_package("pf_dream", os.path.join(fd, "dream"))
        C.synth_package("pf_dream.model", os.path.join(fd, "dream", "model"))
        self.cfg_mod = __import__("pf_dream.model.configuration_dream", fromlist=["x"])
        self.mod = __import__("pf_dream.model.modeling_dream", fromlist=["x"])
        self.gu = __import__("pf_dream.model.generation_utils", fromlist=["x"])
        self.gub = __import__("pf_dream.model.generation_utils_block", fromlist=["x"])
        rec = lambda rel: C.file_record(fd, rel, "NVlabs/Fast-dLLM", "--fast-dllm")  # noqa: E731
        self.records = {
            "config": rec("dream/model/configuration_dream.py"),
            "model": rec("dream/model/modeling_dream.py"),
            "generation_utils": rec("dream/model/generation_utils.py"),
            "generation_utils_block": rec("dream/model/generation_utils_block.py"),
        }

    def construct(self):
        cfg = self.cfg_mod.DreamConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=INTER,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            max_position_embeddings=MAXPOS,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            hidden_act="silu",
            initializer_range=0.02,
            attention_dropout=0.0,
            use_cache=True,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=LAYERS,
            rope_scaling=None,
            mask_token_id=MASK,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
        return self.mod.DreamModel(cfg)

    def reload(self, directory, dtype="float32"):
        return self.mod.DreamModel.from_pretrained(directory, torch_dtype=self.torch_dtype(dtype)).eval()

    def logits(self, model, ids):
        return (
            model(ids, attention_mask="full").logits[0],
            "model(input_ids, attention_mask='full').logits[0]: bidirectional forward as diffusion_generate "
            "calls it; raw logits, NOT shifted (the decoders use cat(logits[:, :1], logits[:, :-1]))",
        )

    def guard_wrappers(self, guard):
        return []

    def calls(self):
        out = []
        for p in range(3):
            for alg in ("entropy", "maskgit_plus", "topk_margin"):
                out.append(
                    Call(
                        "dream.diffusion_generate",
                        p,
                        dict(max_new_tokens=16, steps=16, alg=alg, temperature=0.0, return_dict_in_generate=True),
                        None,
                        False,
                        "1 token per step",
                    )
                )
            out.append(
                Call(
                    "dream.diffusion_generate",
                    p,
                    dict(max_new_tokens=16, steps=16, alg="origin", temperature=0.0, return_dict_in_generate=True),
                    0,
                    False,
                    "origin: which masks are revealed is random (torch.rand < 1 - s/t), tokens are argmax",
                )
            )
            out.append(
                Call(
                    "dream.diffusion_generate",
                    p,
                    dict(max_new_tokens=16, steps=8, alg="entropy", temperature=0.0, return_dict_in_generate=True),
                    None,
                    False,
                    "2 tokens per step",
                )
            )
        for p in range(3):
            for dual in (False, True):
                out.append(
                    Call(
                        "fast_dllm.dream_block_generate",
                        p,
                        dict(
                            max_new_tokens=16,
                            steps=16,
                            alg="confidence_threshold",
                            threshold=0.9,
                            block_length=8,
                            dual_cache=dual,
                            temperature=0.0,
                            return_dict_in_generate=True,
                        ),
                        None,
                        False,
                        "confidence_threshold path (always KV-cached)",
                    )
                )
            for dual in (False, True):
                out.append(
                    Call(
                        "fast_dllm.dream_block_generate",
                        p,
                        dict(
                            max_new_tokens=16,
                            steps=8,
                            alg="entropy",
                            block_length=8,
                            dual_cache=dual,
                            temperature=0.0,
                            return_dict_in_generate=True,
                        ),
                        None,
                        False,
                        "non-threshold (entropy) path, 4 steps per block (always KV-cached)",
                    )
                )
        for c in out:
            c.note += "; mask_token_id (3) not passed: diffusion_generate takes it from model.config"
        return out

    def run(self, model, call, prompt):
        mixin = self.gu if call.function == "dream.diffusion_generate" else self.gub
        # as Fast-dLLM's dream/eval.py does
        model.diffusion_generate = types.MethodType(mixin.DreamGenerationMixin.diffusion_generate, model)
        model._sample = types.MethodType(mixin.DreamGenerationMixin._sample, model)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                out = model.diffusion_generate(prompt, **call.args)
        finally:
            del model.diffusion_generate, model._sample
        extra = {}
        m = re.search(r"used steps: (\d+)", printed.getvalue())
        if m:
            extra["used_steps"] = int(m.group(1))
        return out.sequences, extra

    def family_notes(self):
        sig = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
        src = inspect.getsource(self.gub.DreamGenerationMixin._sample)
        return {
            "fast_dllm.dream_block_generate": {
                "use_cache_is_an_argument": "use_cache" in sig(self.gub.DreamGenerationMixin.diffusion_generate)
                or "use_cache" in sig(self.gub.DreamGenerationMixin._sample),
                "model_calls_pass_use_cache_True": src.count("use_cache=True"),
                "note": "generation_utils_block.diffusion_generate/_sample take no use_cache argument: every model "
                "call passes use_cache=True (prefix cache, or dual cache with replace_position when dual_cache=True)",
            }
        }


# =========================================================================== SDAR
class SDAR(Family):
    name, class_name, shard_size = "sdar", "SDARForCausalLM", "150KB"
    dtypes = ("float32", "bfloat16", "float16")  # SDAR's generate.py loads float16 unless told otherwise
    eos_rows = (EOT, EOS)
    published_extras = {
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        # published SDAR-*-Chat configs carry it; SDARModel never calls _update_causal_mask in eval,
        # and transformers 4.52 still resolves the loaded model to sdpa, so it changes nothing here
        "attn_implementation": "flex_attention",
    }
    drop_keys = ("mask_token_id", "block_size")
    generation_config = {"eos_token_id": [EOT, EOS], "pad_token_id": EOS}
    MODEL_DIR = os.path.join("training", "model", "SDAR-8B-Chat")

    def load(self):
        sd = self.peers["sdar"]
        mdir = os.path.join(sd, self.MODEL_DIR)
        if C.STUBS not in sys.path:
            sys.path.insert(0, C.STUBS)  # flash_attn CPU stand-in (this worker process only)
        C.synth_package("pf_sdar_model", mdir)
        with C.triton_import_only():
            __import__("pf_sdar_model.fused_linear_diffusion_cross_entropy")
        self.cfg_mod = __import__("pf_sdar_model.configuration_sdar", fromlist=["x"])
        self.mod = __import__("pf_sdar_model.modeling_sdar", fromlist=["x"])
        if not getattr(self.mod.flash_attn_func, "__module__", "").startswith("flash_attn"):
            raise C.FixtureError("SDAR did not pick up the flash_attn CPU stand-in")
        self.gen = C.load_file("pf_sdar_generate", os.path.join(sd, "generate.py"))
        rec = lambda rel: C.file_record(sd, rel, "JetAstra/SDAR", "--sdar")  # noqa: E731
        m = self.MODEL_DIR.replace(os.sep, "/")
        self.records = {
            "config": rec(f"{m}/configuration_sdar.py"),
            "model": rec(f"{m}/modeling_sdar.py"),
            "fused_loss": rec(f"{m}/fused_linear_diffusion_cross_entropy.py"),
            "generate": rec("generate.py"),
        }
        stubs = []
        for root, _, files in os.walk(C.STUBS):
            stubs += [
                os.path.relpath(os.path.join(root, f), C.HERE).replace(os.sep, "/") for f in files if f.endswith(".py")
            ]
        self.stand_ins = {p: C.sha256_file(os.path.join(C.HERE, p)) for p in sorted(stubs)}

    def construct(self):
        cfg = self.cfg_mod.SDARConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=INTER,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=16,
            hidden_act="silu",
            max_position_embeddings=MAXPOS,
            initializer_range=0.02,
            rms_norm_eps=1e-6,
            use_cache=False,
            tie_word_embeddings=False,
            rope_theta=1000000,
            rope_scaling=None,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=LAYERS,
            attention_dropout=0.0,
            bos_token_id=BOS,
            eos_token_id=EOS,
            fuse_cross_entropy=True,
            debug=False,
            ep_size=1,
            micro_forward=False,
            skip_checkpoint=False,
            use_deepep=False,
        )
        for k in self.drop_keys:
            if hasattr(cfg, k):
                raise C.FixtureError(f"SDARConfig unexpectedly has {k}")
        return self.mod.SDARForCausalLM(cfg)

    def reload(self, directory, dtype="float32"):
        return self.mod.SDARForCausalLM.from_pretrained(directory, torch_dtype=self.torch_dtype(dtype)).eval()

    @staticmethod
    def block_mask(length, block=4):
        nb = (length + block - 1) // block
        m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block, 0).repeat_interleave(block, 1)
        return m[:length, :length].unsqueeze(0)

    def logits(self, model, ids):
        L = ids.shape[1]
        out = model(
            ids, attention_mask=self.block_mask(L), position_ids=torch.arange(L).unsqueeze(0), use_cache=False
        ).logits[0]
        return out, (
            "model(input_ids, attention_mask=M, position_ids=arange(L)[None], use_cache=False).logits[0] "
            "with M = tril(ones(nb, nb)).repeat_interleave(4, 0).repeat_interleave(4, 1)[:L, :L][None] "
            "(float 0/1, nb = ceil(L/4)): block-causal over 0-based blocks of 4 as block_diffusion_generate "
            "builds it; no cache; raw logits (not shifted)"
        )

    def guard_wrappers(self, guard):
        def make(orig):
            def wrapped(*a, **k):
                out = orig(*a, **k)
                guard.check_draws(out)
                return out

            return wrapped

        return [(torch, "multinomial", make)]

    def calls(self):
        out = []
        gens = {0: 15, 1: 16, 2: 13}
        strategies = [
            (dict(remasking_strategy="low_confidence_dynamic", confidence_threshold=0.85), ""),
            (dict(remasking_strategy="low_confidence_static"), ""),
            (dict(remasking_strategy="sequential"), ""),
            (dict(remasking_strategy="low_confidence_static", temperature=0.7, top_k=5), ""),
            (dict(remasking_strategy="low_confidence_dynamic", confidence_threshold=0.85, top_p=0.9), ""),
            (dict(remasking_strategy="low_confidence_static", stopping_criteria_idx=[EOS, EOT]), ""),
        ]
        for p in range(3):
            for extra, _note in strategies:
                args = dict(
                    mask_id=MASK,
                    gen_length=gens[p],
                    block_length=4,
                    denoising_steps=4,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    confidence_threshold=0.85,
                    stopping_criteria_idx=None,
                )
                args.update(extra)
                out.append(
                    Call(
                        "sdar.block_diffusion_generate",
                        p,
                        args,
                        0,
                        True,
                        "always samples (torch.multinomial); prompt passed as {'input_ids': prompt}",
                    )
                )
        # prompt + gen_length off the block grid: SDAR pads the last block with masks and returns it whole
        off_grid = {0: 16, 1: 13, 2: 16}
        for p in range(3):
            for extra in strategies[:2] + strategies[-1:]:
                args = dict(
                    mask_id=MASK,
                    gen_length=off_grid[p],
                    block_length=4,
                    denoising_steps=4,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    confidence_threshold=0.85,
                    stopping_criteria_idx=None,
                )
                args.update(extra[0])
                out.append(
                    Call(
                        "sdar.block_diffusion_generate",
                        p,
                        args,
                        0,
                        True,
                        f"prompt + gen_length = {len(prompts()[p]) + off_grid[p]}, off the block grid: the "
                        "returned sequence is padded to the next block boundary",
                    )
                )
        return out

    def extra_calls(self):
        """``low_confidence_dynamic`` at ``confidence_threshold`` 0.5 (not SDAR's default 0.85: the value must
        reach the strategy), prompt + gen_length on and off the block grid, in every dtype; after the calls
        above so that their indices stay (cpu.json)."""
        out = []
        for dtype in self.dtypes:
            for p in range(3):
                for gen_length in ({0: 15, 1: 16, 2: 13}[p], {0: 16, 1: 13, 2: 16}[p]):
                    args = dict(
                        mask_id=MASK,
                        gen_length=gen_length,
                        block_length=4,
                        denoising_steps=4,
                        temperature=1.0,
                        top_k=0,
                        top_p=1.0,
                        remasking_strategy="low_confidence_dynamic",
                        confidence_threshold=0.5,
                        stopping_criteria_idx=None,
                    )
                    note = f"dynamic at 0.5; prompt + gen_length = {len(prompts()[p]) + gen_length}"
                    out.append(Call("sdar.block_diffusion_generate", p, args, 0, True, note, dtype))
        return out

    def run(self, model, call, prompt):
        x = self.gen.block_diffusion_generate(model, {"input_ids": prompt}, **call.args)
        P = prompt.shape[1]
        if not torch.equal(x[:, :P], prompt):
            raise C.FixtureError(f"SDAR overwrote the prompt: {x[0, :P].tolist()} != {prompt[0].tolist()}")
        extra = {"returned_length": int(x.shape[1])}
        return x, extra

    def skipped(self):
        src = inspect.getsource(self.gen.block_diffusion_generate)
        branch = src.split('remasking_strategy == "entropy_bounded"', 1)
        broken = (
            len(branch) == 2
            and "transfer_index =" not in branch[1].split("else:", 1)[0]
            and "transfer_index[j" in branch[1]
        )
        if not broken:
            return []
        return [
            {
                "function": "sdar.block_diffusion_generate",
                "args": {"remasking_strategy": "entropy_bounded"},
                "reason": "not run: in the entropy_bounded branch `transfer_index` is indexed "
                "(transfer_index[j, selected_token_indices] = True) but never assigned, so the first step "
                "raises UnboundLocalError (found by reading the function source; the peer file is not "
                "patched here)",
                "error": "UnboundLocalError: cannot access local variable 'transfer_index' where it is not "
                "associated with a value (expected; not executed)",
            }
        ]


# =========================================================================== ReFusion
class ReFusion(Family):
    name, class_name = "refusion", "Qwen3ForCausalLM"
    forbidden = (MASK, EOS)
    published_extras = {
        "auto_map": {
            "AutoConfig": "configuration_qwen3.Qwen3Config",
            "AutoModelForCausalLM": "modeling_qwen3_refusion.Qwen3ForCausalLM",
        }
    }
    generation_config = {"bos_token_id": BOS, "eos_token_id": EOS}

    def load(self):
        rf = self.peers["refusion"]
        # generate.py does `from qwen3.modeling_qwen3_refusion import ...`; qwen3/__init__.py is a transformers
        # _LazyModule naming a missing modeling_qwen3, so `qwen3` is a synthetic package (its __init__ never runs).
        C.synth_package("qwen3", os.path.join(rf, "qwen3"))
        self.cfg_mod = __import__("qwen3.configuration_qwen3", fromlist=["x"])
        self.mod = __import__("qwen3.modeling_qwen3_refusion", fromlist=["x"])
        self.gen = C.load_file("pf_refusion_generate", os.path.join(rf, "generate.py"))
        rec = lambda rel: C.file_record(rf, rel, "ML-GSAI/ReFusion", "--refusion")  # noqa: E731
        self.records = {
            "config": rec("qwen3/configuration_qwen3.py"),
            "model": rec("qwen3/modeling_qwen3_refusion.py"),
            "cache": rec("qwen3/diffusion_cache_utils.py"),
            "generate": rec("generate.py"),
        }

    def construct(self):
        cfg = self.cfg_mod.Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=INTER,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=16,
            hidden_act="silu",
            max_position_embeddings=MAXPOS,
            initializer_range=0.02,
            rms_norm_eps=1e-6,
            use_cache=True,
            tie_word_embeddings=False,
            rope_theta=1000000.0,
            rope_scaling=None,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=LAYERS,
            attention_dropout=0.0,
            bos_token_id=BOS,
            eos_token_id=EOS,
            mask_token_id=MASK,
        )
        return self.mod.Qwen3ForCausalLM(cfg)

    def reload(self, directory, dtype="float32"):
        return self.mod.Qwen3ForCausalLM.from_pretrained(directory, torch_dtype=self.torch_dtype(dtype)).eval()

    def logits(self, model, ids):
        return (
            model(ids).logits[0],
            "model(input_ids).logits[0]: plain causal forward (default sdpa, no cache reuse), raw logits (not shifted)",
        )

    def guard_wrappers(self, guard):
        return []

    def calls(self):
        out = []
        specs = [
            dict(slot_size=4, serial_num_blocks=2, slot_threshold=0.9, token_threshold=0.9, gen_length=16),
            dict(slot_size=8, serial_num_blocks=1, slot_threshold=0.7, token_threshold=0.5, gen_length=32),
            dict(slot_size=4, serial_num_blocks=4, slot_threshold=0.8, token_threshold=0.3, gen_length=32),
        ]
        for p in range(3):
            for s in specs:
                args = dict(
                    gen_length=s["gen_length"],
                    temperature=0.0,
                    mask_id=MASK,
                    slot_size=s["slot_size"],
                    serial_num_blocks=s["serial_num_blocks"],
                    slot_threshold=s["slot_threshold"],
                    token_threshold=s["token_threshold"],
                )
                out.append(
                    Call(
                        "refusion.generate_refusion",
                        p,
                        args,
                        None,
                        False,
                        "called as generate_refusion(model, SimpleNamespace(eos_token_id=1), prompt, **args)",
                    )
                )
        return out

    def extra_calls(self):
        """gen 256 in 8 serial blocks of 32, slots of 8: one slot at a time with every draft accepted (thresholds
        1.0 / 0.0, where confidences of different slots are compared for the top-1 fallback) and the paper's 0.9/0.9."""
        out = []
        for dtype in self.dtypes:
            for slot_t, token_t in ((1.0, 0.0), (0.9, 0.9)):
                for p in (0, 2):
                    args = dict(
                        gen_length=256,
                        temperature=0.0,
                        mask_id=MASK,
                        slot_size=8,
                        serial_num_blocks=8,
                        slot_threshold=slot_t,
                        token_threshold=token_t,
                    )
                    out.append(
                        Call(
                            "refusion.generate_refusion",
                            p,
                            args,
                            None,
                            False,
                            "gen 256: long decode, many top-1 choices between slots",
                            dtype,
                        )
                    )
        return out

    def run(self, model, call, prompt):
        x, tpf = self.gen.generate_refusion(model, types.SimpleNamespace(eos_token_id=EOS), prompt, **call.args)
        return x, {"tpf": float(tpf)}


FAMILIES = {"llada": LLaDA, "dream": Dream, "sdar": SDAR, "refusion": ReFusion}
