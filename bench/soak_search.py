"""Soak of `rlkit serve-search --http` on loopback (issue 49): many concurrent MCP clients, a share of bad calls.

`rlkit serve-search recipes/multihop_rag_grpo.yaml --smoke --http 127.0.0.1:PORT` serves its BM25 index (80
passages); CLIENTS clients (the MCP SDK's streamable-HTTP `Client`, one session each, in one asyncio loop) call
`search` REQUESTS times in all, each client one call at a time. BAD_SHARE of the calls are off the tool's schema (a
number, null or a list for the query, no query, an unknown argument, a 5000-character query, a blank one), and a
thread sends RAW requests that are not MCP at all (a body that is not JSON, a tools/call without a session).

Reported: latency percentiles of good and of bad calls, calls per second, errors by kind (every bad call must come back
as the tool error the model reads, never a protocol error, and the server's stderr must hold no traceback; a raw
request must get a 4xx), the server's resident memory sampled every SAMPLE_S seconds (flat: its growth from the end of
the warm-up to the end), and every good answer compared with the in-process search of the same recipe (the training
environment's, `rlkit.mcp_serve.search_env`). Bounded: no call starts after DEADLINE_S seconds.

    .venv/bin/python bench/soak_search.py
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from common import ROOT, figure, figures_table, machine, machine_line, markdown, offline_env, others_cpu_share

sys.path.insert(0, str(ROOT))
REQUESTS, CLIENTS, WARMUP, RAW = 3000, 32, 100, 60
BAD_SHARE, SEED, DEADLINE_S, SAMPLE_S = 0.15, 0, 90.0, 0.25  # the soak stops issuing after DEADLINE_S
MULTIHOP = ROOT / "recipes" / "multihop_rag_grpo.yaml"
BAD = [  # arguments off the schema, and the one line the model must read back
    ({"query": 5}, "query must be a string, not an integer"),
    ({"query": None}, "query must be a string, not null"),
    ({"query": ["TechCrunch", "Bogota"]}, "query must be a string, not an array"),
    ({}, "missing argument query; search takes: query"),
    ({"query": "TechCrunch", "top_k": 50}, "unknown argument 'top_k'; search takes: query"),
    ({"query": "x" * 5000}, "query too long (5000 characters, limit 2000)"),
    ({"query": "   "}, "empty query; give keywords to search for"),
]
RAW_BODIES = [  # (what, body, headers): none of them an MCP call a server should answer with a result
    ("not JSON", b"{this is not json", {}),
    ("tools/call without a session", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "search", "arguments": {"query": "x"}}}).encode(), {}),
    ("a JSON array of garbage", b"[1, 2, 3]", {}),
]


def calls(queries: list[str]) -> list[tuple[str, dict, str | None]]:
    """REQUESTS calls: (kind, arguments, the expected error or None for a good call), a fixed mix."""
    rng, out = random.Random(SEED), []
    for i in range(REQUESTS):
        if rng.random() < BAD_SHARE:
            arguments, error = BAD[rng.randrange(len(BAD))]
            out.append(("bad", arguments, error))
        else:
            out.append(("good", {"query": queries[i % len(queries)]}, None))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, server: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"soak_search: the server did not start (exit code {server.poll()})") from None
            time.sleep(0.2)


def _raw(url: str, stop: threading.Event, statuses: list) -> None:
    """RAW requests that are not MCP, spread over the soak."""
    for i in range(RAW):
        if stop.wait(DEADLINE_S / RAW / 2):
            break
        what, body, headers = RAW_BODIES[i % len(RAW_BODIES)]
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                statuses.append((what, response.status))
        except urllib.error.HTTPError as e:
            statuses.append((what, e.code))
        except OSError as e:
            statuses.append((what, f"{type(e).__name__}"))


async def _client(url: str, work: list, expected: dict[str, str], results: list, stop_at: float) -> None:
    from mcp import Client

    async with Client(url) as client:
        for kind, arguments, error in work:
            if time.monotonic() > stop_at:
                return
            started = time.perf_counter()
            try:
                result = await client.call_tool("search", arguments)
            except Exception as e:  # noqa: BLE001 (a benchmark counts what failed, by type)
                results.append((kind, f"protocol error: {type(e).__name__}", time.perf_counter() - started))
                continue
            seconds = time.perf_counter() - started
            text = result.content[0].text if result.content else ""
            if kind == "good":
                outcome = ("unexpected tool error" if result.is_error else
                           "answer as in-process" if text == expected[arguments["query"]] else "answer differs")
            else:
                outcome = "refused with its line" if result.is_error and text == error else "not refused as expected"
            results.append((kind, outcome, seconds))


async def _soak(url: str, plan: list, expected: dict[str, str], pid: int) -> dict:
    import psutil

    server = psutil.Process(pid)
    warm: list = []
    await _client(url, plan[:WARMUP], expected, warm, time.monotonic() + DEADLINE_S)
    rss: list[tuple[float, int]] = []
    results: list = []
    stop = threading.Event()
    statuses: list = []
    raw = threading.Thread(target=_raw, args=(url, stop, statuses), daemon=True)
    started = time.monotonic()

    async def sample() -> None:
        while True:
            rss.append((time.monotonic() - started, server.memory_info().rss))
            await asyncio.sleep(SAMPLE_S)

    sampler = asyncio.create_task(sample())
    raw.start()
    rest = plan[WARMUP:]
    await asyncio.gather(*(_client(url, rest[i::CLIENTS], expected, results, started + DEADLINE_S)
                           for i in range(CLIENTS)))
    seconds = time.monotonic() - started
    stop.set()
    raw.join(60)
    await asyncio.sleep(SAMPLE_S)
    sampler.cancel()
    rss.append((time.monotonic() - started, server.memory_info().rss))
    return {"warmup": warm, "results": results, "seconds": seconds, "rss": rss, "raw": statuses}


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    if not ms:
        return {}
    at = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p90_ms": round(at(0.9), 2),
            "p99_ms": round(at(0.99), 2), "max_ms": round(ms[-1], 2)}


def main() -> None:
    from rlkit.data import multihop_rag
    from rlkit.mcp_serve import search_env
    from rlkit.recipe import load_recipe

    before = os.getloadavg()
    queries = [q["query"] for q in multihop_rag.generate(400, seed=7).to_list()]
    env = search_env(load_recipe(MULTIHOP, [], smoke=True))  # builds the index into the cache the server reads
    expected = {}
    for q in queries:
        env.reset()
        expected[q] = env.search(q)
    plan = calls(queries)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with tempfile.TemporaryFile("w+") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "rlkit", "serve-search", str(MULTIHOP), "--smoke", "--http",
                                   f"127.0.0.1:{port}"], env=offline_env(OMP_NUM_THREADS="1"), stderr=stderr)
        try:
            _wait_for(port, server)
            soak = asyncio.run(_soak(url, plan, expected, server.pid))
        finally:
            server.terminate()
            server.wait(30)
        stderr.seek(0)
        log = stderr.read()
    results = soak["results"]
    outcomes: dict[str, int] = {}
    for kind, outcome, _ in soak["warmup"] + results:  # the warm-up's answers are checked too
        outcomes[f"{kind}: {outcome}"] = outcomes.get(f"{kind}: {outcome}", 0) + 1
    good = [s for kind, o, s in results if kind == "good" and o == "answer as in-process"]
    bad = [s for kind, o, s in results if kind == "bad" and o == "refused with its line"]
    protocol = sum(n for k, n in outcomes.items() if "protocol error" in k)
    differs = sum(n for k, n in outcomes.items() if k in ("good: answer differs", "good: unexpected tool error"))
    not_refused = outcomes.get("bad: not refused as expected", 0)
    raw_bad = [s for _, s in soak["raw"] if not (isinstance(s, int) and 400 <= s < 500)]
    tracebacks = log.count("Traceback")
    rss = soak["rss"]
    start_mib, end_mib = rss[0][1] / 2**20, rss[-1][1] / 2**20
    peak_mib = max(r for _, r in rss) / 2**20
    quarter = max(1, len(rss) // 4)
    first_q = statistics.median(r for _, r in rss[:quarter]) / 2**20
    last_q = statistics.median(r for _, r in rss[-quarter:]) / 2**20
    m = {**machine(), "others_cpu_share": others_cpu_share()}
    latency = {"good": _percentiles(good), "bad": _percentiles(bad)}
    figures = [
        figure("calls answered (good and bad)", len(results), "calls", digits=0),
        figure("calls per second, all clients", len(results) / soak["seconds"], "calls/s", digits=1),
        figure("good call latency p50", latency["good"].get("p50_ms", 0), "ms"),
        figure("good call latency p99", latency["good"].get("p99_ms", 0), "ms"),
        figure("bad call latency p50", latency["bad"].get("p50_ms", 0), "ms"),
        figure("protocol errors, server tracebacks, raw requests not refused with a 4xx",
               protocol + tracebacks + len(raw_bad), "", at_most=0, digits=0),
        figure("good answers not identical to the in-process search", differs, "", at_most=0, digits=0),
        figure("bad calls not refused with their one line", not_refused, "", at_most=0, digits=0),
        figure("server RSS growth, first to last quarter of the soak", last_q - first_q, "MiB", at_most=8.0, digits=1,
               note=f"{start_mib:.1f} MiB after the warm-up, {end_mib:.1f} MiB at the end, {peak_mib:.1f} peak"),
    ]
    out = {"name": "soak_search", "title": "rlkit serve-search --http soak", "machine": m, "figures": figures,
           "load_before": before, "load_after": os.getloadavg(), "requests_planned": REQUESTS, "clients": CLIENTS,
           "bad_share": BAD_SHARE, "deadline_s": DEADLINE_S, "seconds": round(soak["seconds"], 2),
           "outcomes": outcomes, "latency": latency, "raw": soak["raw"], "server_tracebacks": tracebacks,
           "rss_mib": [[round(t, 2), round(r / 2**20, 2)] for t, r in rss]}
    results_dir = ROOT / "bench" / "results"
    (results_dir / "soak_search.json").write_text(json.dumps(out, indent=2) + "\n")
    raws: dict[str, int] = {}
    for what, status in soak["raw"]:
        raws[f"{what}: {status}"] = raws.get(f"{what}: {status}", 0) + 1
    lines = ["# rlkit serve-search --http soak", "", f"Machine: {machine_line(m)}", "",
             f"**A shared machine:** 2 cores used by five engineers' jobs at once (load average {before[0]:.1f} "
             f"before, {out['load_after'][0]:.1f} after; other processes kept {m['others_cpu_share'] or 0:.0%} of the "
             "CPUs busy meanwhile). The clients run on the same cores as the server, so latencies and throughput are "
             "those of a crowded machine, not of the server alone; the error counts and the memory do not depend "
             "on it.", "",
             f"{CLIENTS} MCP clients (streamable HTTP, one session each) against `rlkit serve-search "
             f"recipes/multihop_rag_grpo.yaml --smoke --http`: {len(results)} calls in {soak['seconds']:.1f} s "
             f"after {WARMUP} warm-up calls ({REQUESTS} planned, none started after {DEADLINE_S:.0f} s), "
             f"{BAD_SHARE:.0%} of them off the tool's schema, and {len(soak['raw'])} raw requests that are not MCP.",
             "", markdown(figures_table(figures)), "", "## Outcomes", "", "| calls | outcome | count |",
             "|---|---|---|"]
    lines += [f"| {k.split(': ', 1)[0]} | {k.split(': ', 1)[1]} | {n} |" for k, n in sorted(outcomes.items())]
    lines += ["", "## Latency (ms)", "", "| calls | n | p50 | p90 | p99 | max |", "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {v.get('n', 0)} | " + " | ".join(str(v.get(f"{p}_ms")) for p in ("p50", "p90", "p99", "max"))
              + " |" for k, v in latency.items()]
    lines += ["", "## Raw requests (HTTP status)", "", "| request | status | count |", "|---|---|---|"]
    lines += [f"| {k.rsplit(': ', 1)[0]} | {k.rsplit(': ', 1)[1]} | {n} |" for k, n in sorted(raws.items())]
    lines += ["", f"Server stderr: {tracebacks} tracebacks. Server RSS, sampled every {SAMPLE_S} s: "
              f"{start_mib:.1f} MiB at the start of the soak, {end_mib:.1f} MiB at the end, {peak_mib:.1f} MiB peak; "
              f"median of the first quarter {first_q:.1f} MiB, of the last {last_q:.1f} MiB (the series is in "
              "soak_search.json).", "", f"Reproduce: `.venv/bin/python bench/soak_search.py` (the soak stops issuing "
              f"calls after {DEADLINE_S:.0f} s; about 3 minutes in all here, the index and the server starting on the "
              "crowded machine).", ""]
    (results_dir / "soak_search.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
