"""--check: compare a fresh regeneration with the committed fixtures."""

from __future__ import annotations

import json
import os


def _load_st(path):
    from safetensors.torch import load_file

    return load_file(path)


def _json(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _diff_json(a, b, where, out, limit=20):
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{where}.{k}: only in the regeneration ({json.dumps(b[k])[:120]})")
            elif k not in b:
                out.append(f"{where}.{k}: missing from the regeneration")
            else:
                _diff_json(a[k], b[k], f"{where}.{k}", out, limit)
    elif (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b)
        and not all(isinstance(x, (int, float, str, bool)) or x is None for x in a + b)
    ):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff_json(x, y, f"{where}[{i}]", out, limit)
    elif a != b:
        out.append(f"{where}: committed {json.dumps(a)[:200]} != regenerated {json.dumps(b)[:200]}")


def _call_label(c):
    return (
        f"{c.get('function')} prompt {c.get('prompt')} {c.get('dtype', 'float32')} "
        f"args {json.dumps(c.get('args'), sort_keys=True)}"
    )


def compare_golden(old, new, fam, atol, problems, warnings):
    if old.get("made_with") != new.get("made_with"):
        warnings.append(
            f"{fam}/golden.json made_with differs: committed {old.get('made_with')} vs now {new.get('made_with')}"
        )
    oc, nc = old.get("calls", []), new.get("calls", [])
    if len(oc) != len(nc):
        problems.append(f"{fam}/golden.json: {len(oc)} committed calls vs {len(nc)} regenerated")
    ol = {_call_label(c): c for c in oc}
    nl = {_call_label(c): c for c in nc}
    for label in ol:
        if label not in nl:
            problems.append(f"{fam}: call missing from the regeneration: {label}")
            continue
        a, b = ol[label], nl[label]
        if a.get("tokens") != b.get("tokens"):
            problems.append(
                f"{fam}: TOKENS differ for {label}:\n      committed   {a.get('tokens')}\n"
                f"      regenerated {b.get('tokens')}"
            )
        rest = []
        _diff_json(
            {k: v for k, v in a.items() if k != "tokens"}, {k: v for k, v in b.items() if k != "tokens"}, "", rest
        )
        problems.extend(f"{fam}: {label}: {r}" for r in rest)
    for label in nl:
        if label not in ol:
            problems.append(f"{fam}: call only in the regeneration: {label}")
    rest = []
    _diff_json(
        {k: v for k, v in old.items() if k not in ("calls", "made_with")},
        {k: v for k, v in new.items() if k not in ("calls", "made_with")},
        "golden",
        rest,
    )
    problems.extend(f"{fam}: {r}" for r in rest)


def compare_family(old_dir, new_dir, fam, atol):
    import torch

    problems, warnings = [], []
    if not os.path.isdir(old_dir):
        return [f"{fam}: committed folder {old_dir} does not exist"], warnings
    of, nf = set(os.listdir(old_dir)), set(os.listdir(new_dir))
    for f in sorted(of - nf):
        problems.append(f"{fam}/{f}: committed file not produced by the regeneration")
    for f in sorted(nf - of):
        problems.append(f"{fam}/{f}: regenerated file missing from the committed fixtures")
    for f in sorted(of & nf):
        po, pn = os.path.join(old_dir, f), os.path.join(new_dir, f)
        if f.endswith(".safetensors"):
            to, tn = _load_st(po), _load_st(pn)
            if set(to) != set(tn):
                problems.append(f"{fam}/{f}: tensor names differ: {sorted(set(to) ^ set(tn))}")
            for k in sorted(set(to) & set(tn)):
                a, b = to[k], tn[k]
                if a.shape != b.shape or a.dtype != b.dtype:
                    problems.append(f"{fam}/{f}:{k}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
                elif f == "logits.safetensors":
                    d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
                    if a.dtype != torch.float32:  # half-precision logits: bitwise
                        if not torch.equal(a, b):
                            problems.append(f"{fam}/{f}:{k}: {a.dtype} logits differ (max |diff| {d:.3g})")
                    elif not d <= atol:
                        problems.append(f"{fam}/{f}:{k}: max |diff| {d:.3g} > {atol:g}")
                elif not torch.equal(
                    a.view(-1).view(torch.uint8) if a.dtype.is_floating_point else a,
                    b.view(-1).view(torch.uint8) if b.dtype.is_floating_point else b,
                ):
                    d = (a.double() - b.double()).abs().max().item()
                    problems.append(f"{fam}/{f}:{k}: weights not bitwise equal (max |diff| {d:.3g})")
        elif f == "golden.json":
            compare_golden(_json(po), _json(pn), fam, atol, problems, warnings)
        elif f.endswith(".json"):
            rest = []
            _diff_json(_json(po), _json(pn), f"{fam}/{f}", rest)
            problems.extend(rest)
        else:
            with open(po, "rb") as a, open(pn, "rb") as b:
                if a.read() != b.read():
                    problems.append(f"{fam}/{f}: bytes differ")
    return problems, warnings


def compare_tree(old_root, new_root, families, atol):
    problems, warnings = [], []
    for fam in families:
        p, w = compare_family(os.path.join(old_root, fam), os.path.join(new_root, fam), fam, atol)
        problems += p
        warnings += w
    return problems, warnings
