"""bf16 against float32 matmuls on this CPU, with oneDNN as it is and held to narrower instruction sets.

The SmolLM2 recipes train and generate in bf16, which is fast only where the CPU has bf16 matmul units
(AVX512-BF16, AMX). Held to AVX-512 without them (`ONEDNN_MAX_CPU_ISA=AVX512_CORE`: Skylake to Ice Lake) or to
AVX2 (most laptops), torch emulates bf16. Each row is a fresh process with that limit: the matmul at SmolLM2's
MLP shape as its linear layers run it (4,096 tokens x 576 -> 1,536), 2 s of calls per dtype, and what rlkit concludes
there (`rlkit.compat.cpu_supports_bf16`: the demos run in float32 where it is false). A cap on a CPU that has bf16
units still finds them in its flags: the AVX512_CORE row stands for a CPU without them only in its speeds.

    .venv/bin/python bench/bf16_units.py
"""

from __future__ import annotations

import json
import subprocess

from common import PYTHON, figure, offline_env, table, write

THREADS = 2
LIMITS = (None, "AVX512_CORE", "AVX2")  # oneDNN's ISA cap (None: the CPU's own)

PROBE = """
import json, sys, time, torch
from rlkit.compat import cpu_supports_bf16
torch.set_num_threads(int(sys.argv[1]))

def gflops(dtype):  # as an nn.Linear runs it: F.linear with a (out, in) weight
    a, w = torch.randn(4096, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < 2.0:
        torch.nn.functional.linear(a, w)
        calls += 1
    return 2 * 4096 * 576 * 1536 * calls / (time.perf_counter() - started) / 1e9

print(json.dumps({"rlkit_bf16": cpu_supports_bf16(), "bf16": gflops(torch.bfloat16), "fp32": gflops(torch.float32)}))
"""


def probe(limit: str | None) -> dict[str, float]:
    env = {k: v for k, v in offline_env().items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    if limit:
        env["ONEDNN_MAX_CPU_ISA"] = limit
    out = subprocess.run([PYTHON, "-c", PROBE, str(THREADS)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    rows, figures = [], []
    for limit in LIMITS:
        r = probe(limit)
        name = limit or "the CPU's own"
        rows.append([name, round(r["bf16"]), round(r["fp32"]), f"{r['bf16'] / r['fp32']:.2f}x",
                     "bf16" if r["rlkit_bf16"] else "float32"])
        figures.append(figure(f"bf16 / float32 matmul, oneDNN {name}", r["bf16"] / r["fp32"], "x", digits=2))
    write("bf16_units", "bf16 against float32 matmuls, by oneDNN instruction set",
          figures, [table(f"matmul at SmolLM2's MLP shape, {THREADS} threads (GFLOP/s)",
                          ["oneDNN ISA", "bf16", "float32", "bf16 / float32", "the demos run in"], rows)],
          what=__doc__.split("\n\n")[1].replace("\n", " "))


if __name__ == "__main__":
    main()
