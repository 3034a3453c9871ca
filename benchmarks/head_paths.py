"""Do the fused LM-head statistics decide as the plain projection does? Measured per device and dtype.

Run:  python benchmarks/head_paths.py [--device cuda] [--trials 20] [--vocab 32000] [--dim 256]

For random heads whose rows come in nearly equal pairs (logits that nearly
tie) and random hidden states of 64 rows, compares what a decoder reads from
the plain path (the network's own head: ``F.linear`` of all 64 rows, then
``Scores.stats``) with what it reads from the fused path
(``Scores(hidden, head)``, the rows read projected by
:class:`refusion.models.head.LMHead`: the Triton kernel on CUDA, the torch path
elsewhere), for all rows and for subsets of 1, 3 and 8 rows: the argmax
token, the greedy confidence (bit for bit) and the confidence rounded to the
model's dtype (what the peers' presets compare). Also prints what
:func:`refusion.engines.invariant.probe_rows` measured on the device.
"""

from __future__ import annotations

import argparse
import sys

import torch

from refusion.decoding.scores import Scores
from refusion.engines.invariant import probe_rows
from refusion.models.head import LMHead


def near_tie(vocab: int, dim: int, dtype: torch.dtype, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g)
    weight[1::2] = weight[0::2][: len(weight[1::2])] + torch.randn(len(weight[1::2]), dim, generator=g) * 1e-6
    hidden = torch.randn(64, dim, generator=g) * 2
    return LMHead(weight.to(device=device, dtype=dtype)), hidden.to(device=device, dtype=dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dim", type=int, default=256)
    a = ap.parse_args(argv)
    print(
        f"device {a.device} ({torch.cuda.get_device_name() if a.device == 'cuda' else 'CPU'}), torch "
        f"{torch.__version__}"
    )
    print(
        f"{'dtype':<9} {'probe (depends, min_rows)':<26} {'rows read':<10} {'tokens equal':>14} "
        f"{'confidence bitwise':>19} {'confidence in dtype':>20}"
    )
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        probe = probe_rows(a.device, dtype)
        for read in (64, 8, 3, 1):
            same = bits = rounded = total = 0
            for seed in range(a.trials):
                head, hidden = near_tie(a.vocab, a.dim, dtype, a.device, seed)
                plain = Scores(logits=torch.nn.functional.linear(hidden, head.weight))
                rows = torch.arange(read, device=a.device) * (64 // read)
                want_tokens, want_prob = plain[rows].greedy(3)
                tokens, prob = Scores(hidden=hidden, head=head)[rows].greedy(3)
                same += int((tokens == want_tokens).sum())
                bits += int((prob == want_prob).sum())
                rounded += int((prob.to(dtype) == want_prob.to(dtype)).sum())
                total += read
            print(
                f"{str(dtype).split('.')[-1]:<9} {str((probe.depends, probe.min_rows)):<26} {read:<10} "
                f"{same:>7}/{total:<6} {bits:>11}/{total:<6} {rounded:>12}/{total:<6}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
