"""Serving: the live ``refusion serve`` under N concurrent clients, and continuous vs static batching.

Run:  python benchmarks/serving.py [--clients 32] [--rounds 3] [--max-rows 32] [--requests 64] [--gap-ms 4]
                                   [--part 1|2|3] [--prefix-chars 64]

Part 1, the live server (a subprocess of ``refusion serve`` on the shipped
model, 1 torch thread, ``--max-rows`` rows) against ``--clients`` clients
that each stream one completion of a held-out prompt at the same moment
(httpx, one connection each), vs the same prompts through one offline
``decode_batch`` in this process (1 torch thread). Interleaved round by
round after a warm-up round; per round: throughput (generated tokens per
wall second), time to first text (client-side, per request), p50/p99
latency, and the server's CPU seconds. Every answer is checked against the
offline tokens.

Part 2, scheduling alone (in this process, no HTTP): ``--requests`` prompts
arriving ``--gap-ms`` apart are decoded by a continuous-batching
``Generator`` (requests join between steps, at most ``--batch`` rows) and by
static batches of the same size (when idle, take up to ``--batch`` waiting
requests and decode them together to the end), both with ``--preset``
(default ``ar``: lossless left to right, one 8-token slot per step, so
a static batch lasts as many steps as its longest answer has slots). Both run interleaved with
benchmarks/common.py's ``interleave`` (CPU and wall, medians over rounds);
reports latency from arrival to the last token (p50/p99), the time to
finish all requests and the ratios continuous / static.

Part 3, prefix reuse across requests (issue 34): two live servers, the
default one (prefix reuse on) and one started with ``--no-prefix-cache``,
each against ``--clients`` streaming clients whose prompts share a
``--prefix-chars``-character prefix (one token per character on the shipped
model) before a held-out prompt, interleaved round by round after a warm-up
wave to each (a server keeps its prefix cache across waves, as it would
across traffic). Reported per server as in part 1, plus the prompt tokens
its prefix cache found (``/metrics``); every answer is checked against
offline decoding of the same prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import header, interleave

from refusion.api import load_model
from refusion.generator import Generator
from refusion.training.tasks import held_out

ROOT = Path(__file__).resolve().parent.parent
GEN = 32  # the shipped model's preset length


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def prompts_for(count):
    examples = held_out(count // 6 + 1)
    return [examples[i % len(examples)].prompt for i in range(count)]


#: what a table row reports of each wave of clients: throughput, time to first text and latency (p50, p99, ms), the
#: server's CPU seconds
WAVE_FIELDS = (
    lambda x: x["tps"],
    lambda x: 1000 * percentile(x["ttft"], 50),
    lambda x: 1000 * percentile(x["ttft"], 99),
    lambda x: 1000 * percentile(x["latency"], 50),
    lambda x: 1000 * percentile(x["latency"], 99),
    lambda x: x["server_cpu"],
)


def wave_cells(runs, fields) -> str:
    """Table cells: each field's median over ``runs`` with its [min-max]."""
    cells = []
    for field in fields:
        values = [field(x) for x in runs]
        m, lo, hi = statistics.median(values), min(values), max(values)
        cells.append(f"{m:.0f} [{lo:.0f}-{hi:.0f}]" if m >= 10 else f"{m:.2f} [{lo:.2f}-{hi:.2f}]")
    return " | ".join(cells)


# -- part 1: the live server ---------------------------------------------------------------
class Server:
    def __init__(self, max_rows, *flags):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "refusion.cli",
                "serve",
                "--port",
                str(self.port),
                "--threads",
                "1",
                "--max-rows",
                str(max_rows),
                "--log-level",
                "warning",
                *flags,
            ],
            cwd=ROOT,
            env=env,
        )
        for _ in range(600):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def cpu(self):
        fields = open(f"/proc/{self.process.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.process.terminate()
        self.process.wait(60)


async def one_stream(client, url, prompt):
    start = time.perf_counter()
    first, tokens = None, None
    body = {"model": "refusion-default", "prompt": prompt, "stream": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"][0]["text"]:
                first = time.perf_counter() - start
            if chunk["choices"][0]["finish_reason"] is not None:
                tokens = chunk["refusion"]["tokens"]
    return first, time.perf_counter() - start, tokens


async def clients_wave(url, prompts):
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.perf_counter()
        out = await asyncio.gather(*(one_stream(client, url, p) for p in prompts))
        return out, time.perf_counter() - start


def part1(clients, rounds, max_rows):
    adapter = load_model()
    prompts = prompts_for(clients)
    ids = [adapter.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    offline_tokens = [r.tokens.tolist() for r in Generator(adapter).decoder.decode_batch(adapter, ids, GEN)]
    decoder = Generator(adapter).decoder
    server = Server(max_rows)
    rows = {"server": [], "offline": []}
    try:

        def run_server():
            cpu0 = server.cpu()
            out, wall = asyncio.run(clients_wave(server.url, prompts))
            assert [t for _, _, t in out] == offline_tokens, "a served answer differs from offline decoding"
            tokens = sum(len(t) for t in offline_tokens)
            return dict(
                wall=wall,
                tps=tokens / wall,
                ttft=[f for f, _, _ in out],
                latency=[lat for _, lat, _ in out],
                server_cpu=server.cpu() - cpu0,
            )

        def run_offline():
            start, cpu0 = time.perf_counter(), time.process_time()
            results = decoder.decode_batch(adapter, ids, GEN)
            wall = time.perf_counter() - start
            assert [r.tokens.tolist() for r in results] == offline_tokens
            tokens = sum(len(t) for t in offline_tokens)
            return dict(
                wall=wall,
                tps=tokens / wall,
                ttft=[wall] * len(ids),
                latency=[wall] * len(ids),
                server_cpu=time.process_time() - cpu0,
            )

        competitors = {"server": run_server, "offline": run_offline}
        for fn in competitors.values():
            fn()  # warm-up
        for r in range(rounds):
            for name in ["server", "offline"] if r % 2 == 0 else ["offline", "server"]:
                rows[name].append(competitors[name]())
    finally:
        server.stop()
    tokens = sum(len(t) for t in offline_tokens)
    print(
        f"\n## Part 1: {clients} concurrent streaming clients vs offline decode_batch ({clients} prompts, "
        f"{tokens} tokens, server --max-rows {max_rows}, medians over {rounds} rounds [min-max])\n"
    )
    print(
        "| path | throughput tok/s | time to first text p50 ms | p99 ms | latency p50 ms | p99 ms | "
        "CPU s (server / offline) | wall s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, label in (("server", "refusion serve, streaming"), ("offline", "offline decode_batch (one batch)")):
        print(f"| {label} | {wave_cells(rows[name], (*WAVE_FIELDS, lambda x: x['wall']))} |")
    ratios = [s["tps"] / o["tps"] for s, o in zip(rows["server"], rows["offline"])]
    print(
        f"\nserver / offline throughput, per round: {statistics.median(ratios):.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )


# -- part 3: prefix reuse across requests -------------------------------------------------------
#: a shared prefix of the shipped model's alphabet (its tokenizer reads one token per character)
PREFIX_TEXT = "copy the letters abcdefghijklmnopqrstuvwxyz and then zyxwvutsrqponmlkjihgfedcba and so on "


def prefix_hits(server):
    """The server's ``refusion_prefix_cache_hits_total`` (prompt tokens its prefix cache found so far)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "refusion_prefix_cache_hits_total":
                return sample.value
    return 0.0


def part3(clients, rounds, max_rows, prefix_chars):
    adapter = load_model()
    shared = (PREFIX_TEXT * (prefix_chars // len(PREFIX_TEXT) + 1))[:prefix_chars]
    prompts = [shared + p for p in prompts_for(clients)]
    ids = [adapter.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    decoder = Generator(adapter).decoder
    offline_tokens = [r.tokens.tolist() for r in decoder.decode_batch(adapter, ids, GEN)]
    servers = {"prefix reuse (default)": Server(max_rows), "--no-prefix-cache": Server(max_rows, "--no-prefix-cache")}
    rows = {name: [] for name in servers}
    try:

        def wave(server):
            cpu0, hits0 = server.cpu(), prefix_hits(server)
            out, wall = asyncio.run(clients_wave(server.url, prompts))
            assert [t for _, _, t in out] == offline_tokens, "a served answer differs from offline decoding"
            return dict(
                tps=sum(len(t) for t in offline_tokens) / wall,
                ttft=[f for f, _, _ in out],
                latency=[lat for _, lat, _ in out],
                server_cpu=server.cpu() - cpu0,
                wall=wall,
                hits=prefix_hits(server) - hits0,
            )

        for server in servers.values():
            wave(server)  # warm-up: the default server caches the shared prefix's pages here
        names = list(servers)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                rows[name].append(wave(servers[name]))
    finally:
        for server in servers.values():
            server.stop()
    print(
        f"\n## Part 3: {clients} streaming clients, prompts sharing a {prefix_chars}-character prefix "
        f"({len(ids[0])}-{max(map(len, ids))} tokens each), server --max-rows {max_rows}, medians over {rounds} "
        "rounds [min-max]\n"
    )
    print(
        "| server | throughput tok/s | time to first text p50 ms | p99 ms | latency p50 ms | p99 ms | server CPU s "
        "| prompt tokens found per wave |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, runs in rows.items():
        print(f"| {name} | {wave_cells(runs, WAVE_FIELDS)} | {statistics.median(x['hits'] for x in runs):.0f} |")
    on, off = rows.values()
    ratios = [a["tps"] / b["tps"] for a, b in zip(on, off)]
    cpu = [b["server_cpu"] / a["server_cpu"] for a, b in zip(on, off)]
    print(
        f"\nprefix reuse vs none, per round: throughput {statistics.median(ratios):.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}], server CPU without / with reuse {statistics.median(cpu):.2f}x "
        f"[{min(cpu):.2f}-{max(cpu):.2f}]"
    )


# -- part 2: continuous vs static batching -------------------------------------------------------
def arrivals(count, gap):
    return [i * gap for i in range(count)]


def continuous(adapter, ids, times, batch, preset):
    generator = Generator(adapter, max_rows=batch, preset=preset)
    start = time.perf_counter()
    pending, requests, finish = list(range(len(ids))), {}, {}
    while pending or not generator.idle():
        now = time.perf_counter() - start
        while pending and times[pending[0]] <= now:
            i = pending.pop(0)
            requests[i] = generator.submit(ids[i], gen_length=GEN)
        if generator.idle():
            time.sleep(max(0.0, times[pending[0]] - (time.perf_counter() - start)))
            continue
        for event in generator.step():
            if event.finished:
                finish[next(i for i, r in requests.items() if r is event.request)] = time.perf_counter() - start
    tokens = [requests[i].result.tokens.tolist() for i in range(len(ids))]
    return dict(
        latency=[finish[i] - times[i] for i in range(len(ids))],
        makespan=max(finish.values()),
        tokens=sum(map(len, tokens)),
        rows=tokens,
    )


def static(adapter, ids, times, batch, preset):
    decoder = Generator(adapter, preset=preset).decoder
    start = time.perf_counter()
    done, finish, rows = 0, {}, {}
    while done < len(ids):
        now = time.perf_counter() - start
        if times[done] > now:
            time.sleep(times[done] - now)
            now = time.perf_counter() - start
        chunk = [i for i in range(done, min(done + batch, len(ids))) if times[i] <= now]
        for i, result in zip(chunk, decoder.decode_batch(adapter, [ids[i] for i in chunk], GEN)):
            rows[i] = result.tokens.tolist()
        for i in chunk:
            finish[i] = time.perf_counter() - start
        done += len(chunk)
    tokens = [rows[i] for i in range(len(ids))]
    return dict(
        latency=[finish[i] - times[i] for i in range(len(ids))],
        makespan=max(finish.values()),
        tokens=sum(map(len, tokens)),
        rows=tokens,
    )


def part2(count, gap_ms, batch, rounds, preset):
    adapter = load_model()
    prompts = prompts_for(count)
    ids = [adapter.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    times = arrivals(count, gap_ms / 1000)
    results = interleave(
        {
            "static": lambda: static(adapter, ids, times, batch, preset),
            "continuous": lambda: continuous(adapter, ids, times, batch, preset),
        },
        adapter,
        rounds=rounds,
        baseline="static",
        memory=False,
    )
    assert results[0].runs[0].counts["rows"] == results[1].runs[0].counts["rows"], "the two schedules differ"
    print(
        f"\n## Part 2: {count} requests arriving {gap_ms} ms apart, batches of at most {batch}, preset {preset} "
        f"(medians over {rounds} rounds [min-max])\n"
    )
    print("| schedule | latency p50 ms | latency p99 ms | all done s | tokens/s | CPU s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    per_round = {}
    for row in results:
        p50 = [1000 * percentile(r.counts["latency"], 50) for r in row.runs]
        p99 = [1000 * percentile(r.counts["latency"], 99) for r in row.runs]
        span = [r.counts["makespan"] for r in row.runs]
        tps = [r.counts["tokens"] / r.counts["makespan"] for r in row.runs]
        cpu = [r.cpu for r in row.runs]
        per_round[row.name] = (p50, tps)
        cells = [(p50, 0), (p99, 0), (span, 2), (tps, 0), (cpu, 2)]
        print(
            f"| {row.name} batching | "
            + " | ".join(f"{statistics.median(v):.{d}f} [{min(v):.{d}f}-{max(v):.{d}f}]" for v, d in cells)
            + " |"
        )
    lat = [s / c for s, c in zip(per_round["static"][0], per_round["continuous"][0])]
    thr = [c / s for s, c in zip(per_round["static"][1], per_round["continuous"][1])]
    print(
        f"\ncontinuous vs static, per round: p50 latency {statistics.median(lat):.2f}x lower "
        f"[{min(lat):.2f}-{max(lat):.2f}], throughput {statistics.median(thr):.2f}x [{min(thr):.2f}-{max(thr):.2f}]"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--max-rows",
        type=int,
        default=32,
        help="the server's rows (default 32: all clients at once, as the offline batch)",
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--gap-ms", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--preset",
        default="ar",
        help="part 2's decoding preset (default ar: one 8-token slot per "
        "step, so answers of different lengths take different numbers of steps)",
    )
    parser.add_argument("--part", type=int, choices=(1, 2, 3), action="append", default=None)
    parser.add_argument("--prefix-chars", type=int, default=64, help="part 3's shared prefix (default 64)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(header())
    parts = args.part or [1, 2]
    if 1 in parts:
        part1(args.clients, args.rounds, args.max_rows)
    if 2 in parts:
        part2(args.requests, args.gap_ms, args.batch, args.rounds, args.preset)
    if 3 in parts:
        part3(args.clients, args.rounds, args.max_rows, args.prefix_chars)
    return 0


if __name__ == "__main__":
    sys.exit(main())
