"""An independent, plain re-statement of the reference decoder (ML-GSAI/ReFusion generate_refusion).

Written from the algorithm's description, batch 1, in the reference's own data
flow (lock-step branches, batch-repeated cache, commit-order append) and with
none of refusion's parts, so that tests can compare the library against it.
``eos_bug=True`` reproduces the reference's EOS handling in the parallel path
(an index into the chosen slots used as an index into all remaining slots).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _forward(model, ids, pos, cache):
    mask = torch.ones(ids.shape[0], cache.get_seq_length() + ids.shape[1], dtype=torch.long)
    return model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits


def _crop_to(cache, length):
    cache.crop(length - cache.get_seq_length())


def _argmax(logits, mask_id):
    """Argmax that never picks the mask token (refusion never drafts it; the reference could)."""
    top = logits.topk(2, dim=-1).indices
    return torch.where(top[..., 0] == mask_id, top[..., 1], top[..., 0])


def _shifted_probs(logits, tokens):
    shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return F.softmax(shifted, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def reference_refusion(
    model,
    prompt,
    gen_length,
    *,
    mask_id,
    eos_id,
    slot_size,
    serial_num_blocks,
    slot_threshold,
    token_threshold,
    eos_bug=False,
):
    """Return the generated tokens (position order, up to and including EOS when committed) as a list."""
    S = slot_size
    G = -(-gen_length // S) * S
    P = len(prompt)
    cur_x = list(prompt)
    cur_pos = list(range(P))
    cache = None
    block_len = G // serial_num_blocks
    eos_seen = False
    for b in range(serial_num_blocks):
        rem = [P + b * block_len + j * S for j in range(block_len // S)]  # start position of each remaining slot
        while rem:
            pos = torch.tensor([[s + i for s in rem for i in range(S)]])
            masks = torch.full_like(pos, mask_id)
            if cache is None:
                cache = DynamicCache(config=model.config)
                logits = _forward(
                    model,
                    torch.cat([torch.tensor([cur_x]), masks], 1),
                    torch.cat([torch.tensor([cur_pos]), pos], 1),
                    cache,
                )[:, P:]
            else:
                logits = _forward(model, masks, pos, cache)
            _crop_to(cache, len(cur_x))
            best = _argmax(logits, mask_id)[0]
            x0 = best.view(-1, S)
            p0 = F.softmax(logits, -1)[0].gather(-1, best.unsqueeze(-1)).squeeze(-1).view(-1, S)
            conf = p0[:, 0]
            chosen = (conf > slot_threshold).nonzero().flatten().tolist() or [int(conf.argmax())]
            chosen.sort()
            k = len(chosen)
            drafts = x0[chosen].clone()
            cpos = pos[0].view(-1, S)[chosen]
            scores = p0[chosen].clone()

            # global verification
            vlogits = _forward(model, drafts.reshape(1, -1), cpos.reshape(1, -1), cache)
            scores[:, 1:] = _shifted_probs(vlogits, drafts.reshape(1, -1)).view(k, S)[:, 1:]
            ok = scores > token_threshold
            ok[:, 0] = True
            tags = ok.long().cumprod(1)
            flat = drafts.reshape(-1)
            prefix = int(ok.reshape(-1).long().cumprod(0).sum())
            eos_hits = (flat[:prefix] == eos_id).nonzero().flatten().tolist() if eos_id is not None else []
            if eos_hits or prefix // S:
                if eos_hits:
                    e = eos_hits[0]
                    nslots, cut = e // S + 1, e + 1
                    drop_from = rem.index(rem[chosen[nslots - 1]])
                    remove = set(range(drop_from, len(rem))) | set(chosen[:nslots])
                    eos_seen = True
                else:
                    nslots = prefix // S
                    cut = nslots * S
                    remove = set(chosen[:nslots])
                cur_x += flat[:cut].tolist()
                cur_pos += cpos.reshape(-1)[:cut].tolist()
                _crop_to(cache, len(cur_x))
                rem = [s for i, s in enumerate(rem) if i not in remove]
                continue
            _crop_to(cache, len(cur_x))

            # parallel infilling, lock-step from the slowest branch
            spec = drafts.clone()
            A = 0
            eos_row = None
            if k > 1:
                cache.batch_repeat_interleave(k)
            for _ in range(S):
                if not bool((tags == 0).any()):
                    break
                window_tags = tags[:, A:]
                masked = torch.where(window_tags.bool(), spec[:, A:], torch.full_like(spec[:, A:], mask_id))
                base = cache.get_seq_length()
                dlogits = _forward(model, masked, cpos[:, A:], cache)
                _crop_to(cache, base)
                spec[:, A:] = torch.where(window_tags.bool(), spec[:, A:], _argmax(dlogits, mask_id))
                vlogits = _forward(model, spec[:, A:], cpos[:, A:], cache)
                pm = _shifted_probs(vlogits, spec[:, A:]) > token_threshold
                forced = F.pad(tags[:, A:], (1, 0), value=1)[:, :-1]
                pm[forced == 1] = True
                tags[:, A:] = pm.long().cumprod(1)
                if eos_id is not None:
                    new_eos = (spec[:, A:] == eos_id) & (tags[:, A:] == 1)
                    rows = new_eos.any(1).nonzero().flatten().tolist()
                    if rows:
                        r = rows[0]
                        eos_row = r
                        spec, tags, cpos = spec[: r + 1], tags[: r + 1], cpos[: r + 1]
                        chosen = chosen[: r + 1]
                        tags[r] = 1
                        cache.batch_select_indices(torch.arange(r + 1))
                n_new = int(tags[:, A:].sum(1).min())
                if n_new > 0:
                    A += n_new - 1 if bool((tags == 0).any()) else n_new
                    _crop_to(cache, len(cur_x) + A)
            layers = [(layer.keys[:, :, -S:], layer.values[:, :, -S:]) for layer in cache.layers]
            _crop_to(cache, len(cur_x))
            cache.batch_select_indices(torch.tensor([0]))
            flat = spec.reshape(-1)
            is_eos = (flat == eos_id) if eos_id is not None else torch.zeros_like(flat, dtype=torch.bool)
            keep = (is_eos.long().cumsum(0) - is_eos.long()) == 0
            for li, (kk, vv) in enumerate(layers):
                fk = kk.permute(1, 0, 2, 3).reshape(1, kk.shape[1], -1, kk.shape[3])[:, :, keep]
                fv = vv.permute(1, 0, 2, 3).reshape(1, vv.shape[1], -1, vv.shape[3])[:, :, keep]
                cache.layers[li].keys = torch.cat([cache.layers[li].keys, fk], dim=2)
                cache.layers[li].values = torch.cat([cache.layers[li].values, fv], dim=2)
            cur_x += flat[keep].tolist()
            cur_pos += cpos.reshape(-1)[keep].tolist()
            remove = set(chosen)
            if eos_row is not None:
                eos_seen = True
                if eos_bug:
                    remove |= set(range(eos_row, len(rem)))
                else:
                    remove |= set(range(chosen[eos_row], len(rem)))
            rem = [s for i, s in enumerate(rem) if i not in remove]
        if eos_seen:
            break
    order = sorted(range(len(cur_pos)), key=cur_pos.__getitem__)
    out = [cur_x[i] for i in order][P:]
    if eos_id is not None and eos_id in out:
        out = out[: out.index(eos_id) + 1]
    return out
