"""What every benchmark shares: the machine description, timing, and writing `results/<name>.{json,md}`.

A benchmark produces *figures* (one number each, with the target it is held to, if any) and *tables*
(the measurements behind them). `write` saves both as JSON and as a Markdown page, and prints the
tables; `bench/run.py` gathers every page's figures into `results/README.md`.

Only the standard library, rich and rlkit's light demo helpers are imported here, so `bench/help.py` can time
`rlkit --help` without loading torch first.
"""

from __future__ import annotations

import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from rlkit.demos.stages import cpu_model  # the standard library only: no torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
# The interpreter of the venv when there is one (`make bench`), else whichever runs this script.
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
_PACKAGES = ("rlkit", "torch", "transformers", "trl", "peft", "datasets", "bm25s", "rank_bm25")


def machine() -> dict[str, Any]:
    """Where the numbers were measured: CPU, cores, RAM, OS, Python, package versions, date, load."""
    return {
        "cpu": cpu_model(),
        "gpu": _gpu(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in _PACKAGES},
        "git": _git_sha(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # For the record only: under `make bench` it counts the previous benchmark too (see `busy`).
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def machine_line(m: dict[str, Any], when: bool = True) -> str:
    """The machine in one line; `when`: with the date, git commit and load average of the run."""
    v = m["versions"]
    line = (f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; {m['os']}; Python {m['python']}; "
            f"torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}")
    if m.get("gpu"):
        line = f"{m['gpu']}; {line}"
    if when:
        line += f"; {m['date']} (git {m['git'] or '?'}, load average {m['load_average_1min']} at the start"
        if m.get("others_cpu_share") is not None:
            line += f", other processes used {m['others_cpu_share']:.0%} of the CPUs meanwhile"
        line += ")"
    return line


def busy(m: dict[str, Any]) -> bool:
    """Whether other processes used more than a quarter of the CPUs while the benchmark ran (its timings then
    say little). The load average cannot tell: under `make bench` it counts the previous benchmark too."""
    share = m.get("others_cpu_share")
    return share is not None and share > 0.25


def _cpu_snapshot() -> tuple[float, float, float] | None:
    """(wall seconds, busy CPU seconds of the whole machine, CPU seconds of this process and its waited children)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    busy_jiffies = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    return time.perf_counter(), busy_jiffies / os.sysconf("SC_CLK_TCK"), ours


_START = _cpu_snapshot()  # when the benchmark script started (it imports this module first)


def others_cpu_share() -> float | None:
    """The share of all CPUs that processes other than this benchmark kept busy since it started."""
    end = _cpu_snapshot()
    if _START is None or end is None or end[0] <= _START[0]:
        return None
    wall, machine_busy, ours = (b - a for a, b in zip(_START, end, strict=True))
    return round(max(0.0, machine_busy - ours) / (wall * (os.cpu_count() or 1)), 3)


def _gpu() -> str | None:
    """The CUDA device, when this benchmark has imported torch and has one (never imports torch itself)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


# ---------------------------------------------------------------------------------------------
# Timing


def times(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Wall seconds of `repeat` calls of `fn`."""
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def offline_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: offline, like `make test` (nothing here downloads)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "UNSLOTH_DISABLE_CPU_FALLBACK": "1",
            "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", **extra}


# ---------------------------------------------------------------------------------------------
# Figures and tables


def figure(name: str, value: float, unit: str, *, at_least: float | None = None, at_most: float | None = None,
           digits: int = 2, note: str = "") -> dict[str, Any]:
    """One reported number and the target it is held to (`at_least` / `at_most`), if any."""
    if at_least is not None:
        target, met = f">= {at_least:g}", value >= at_least
    elif at_most is not None:
        target, met = f"<= {at_most:g}", value <= at_most
    else:
        target, met = None, None
    return {"figure": name, "value": round(value, digits), "unit": unit, "target": target, "met": met, "note": note}


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    return {"title": title, "columns": list(columns), "rows": [[_cell(c) for c in row] for row in rows]}


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4) if abs(value) < 100 else round(value, 1)
    return value


def figures_table(figures: Sequence[dict[str, Any]], with_bench: bool = False) -> dict[str, Any]:
    columns = (["benchmark"] if with_bench else []) + ["figure", "value", "target", "met"]
    rows = [([f["bench"]] if with_bench else []) + [f["figure"], f"{f['value']:g} {f['unit']}".strip(),
                                                      f["target"] or "-", _met(f["met"])]
            for f in figures]
    return table("Figures", columns, rows)


def _met(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "**no**"


def markdown(t: dict[str, Any]) -> str:
    """A GitHub Markdown table, laid out by rich (`box.MARKDOWN`)."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=10_000, markup=False, highlight=False, emoji=False, color_system=None).print(
        _rich_table(t, markdown=True))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines() if line.strip())


def show(t: dict[str, Any]) -> None:
    from rich.console import Console

    Console(highlight=False, width=max(Console().width, 140)).print(_rich_table(t, markdown=False))


def _rich_table(t: dict[str, Any], markdown: bool):
    from rich import box
    from rich.table import Table

    out = Table(title=None if markdown else t["title"], box=box.MARKDOWN if markdown else box.SIMPLE_HEAD)
    for column in t["columns"]:
        out.add_column(column.replace("|", "\\|") if markdown else column)
    for row in t["rows"]:
        out.add_row(*(str(c).replace("|", "\\|") if markdown else str(c) for c in row))
    return out


def write(name: str, title: str, figures: list[dict[str, Any]], tables: list[dict[str, Any]], *,
          what: str, details: dict[str, Any] | None = None, notes: Sequence[str] = (),
          reproduce: str | None = None) -> dict[str, Any]:
    """Save `results/<name>.json` and `results/<name>.md`, print the tables; returns the JSON document."""
    doc = {"name": name, "title": title, "what": what,
           "machine": {**machine(), "others_cpu_share": others_cpu_share()},
           "figures": figures, "tables": tables, "details": details or {}, "notes": list(notes)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    parts = [f"# {title}", what, f"Machine: {machine_line(doc['machine'])}"]
    if busy(doc["machine"]):
        parts.append(f"**The machine was busy**: other processes kept {doc['machine']['others_cpu_share']:.0%} of "
                     "its CPUs busy while this ran. Re-run on an idle machine before trusting the timings.")
    parts += ["## Figures", markdown(figures_table(figures))]
    for t in tables:
        parts += [f"## {t['title']}", markdown(t)]
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    parts.append(reproduce or f"Reproduce: `.venv/bin/python bench/{name}.py` (or `make bench` for all the CPU "
                              "benchmarks).")
    (RESULTS / f"{name}.md").write_text("\n\n".join(parts) + "\n")
    for t in [*tables, figures_table(figures)]:
        show(t)
    return doc
