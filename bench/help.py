"""How long the CLI takes to answer: `rlkit --help` (target <= 0.3 s) and `rlkit recipes validate`.

Each command runs as a fresh process, as a user runs it, so the time includes the interpreter's start;
the median of several runs is reported. Rows without a target show where `--help`'s time goes: the
bare interpreter, importing `rlkit.cli`, and the same help text without typer's rich formatting
(`TYPER_USE_RICH=0`).

    .venv/bin/python bench/help.py
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from common import PYTHON, ROOT, figure, median, offline_env, table, write

RLKIT = str(Path(PYTHON).with_name("rlkit"))  # the entry point installed next to the interpreter
HELP_RUNS = 10
VALIDATE_RUNS = 3


def wall(argv: list[str], runs: int, env: dict[str, str], warm: bool) -> list[float]:
    """Wall seconds of `runs` fresh processes of `argv`; `warm`: after one untimed run (warms the file cache)."""
    if warm:
        subprocess.run(argv, env=offline_env(**env), cwd=ROOT, capture_output=True, check=True)
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=offline_env(**env), cwd=ROOT, capture_output=True, check=True)
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    cases = [
        ("python -c pass (interpreter start)", [PYTHON, "-c", "pass"], HELP_RUNS, {}),
        ("python -c 'import rlkit.cli'", [PYTHON, "-c", "import rlkit.cli"], HELP_RUNS, {}),
        ("rlkit --help", [RLKIT, "--help"], HELP_RUNS, {}),
        ("rlkit --help, TYPER_USE_RICH=0", [RLKIT, "--help"], HELP_RUNS, {"TYPER_USE_RICH": "0"}),
        ("rlkit recipes validate (all shipped recipes)", [RLKIT, "recipes", "validate"], VALIDATE_RUNS, {}),
    ]
    measured = {}
    for name, argv, runs, env in cases:
        # `recipes validate` takes many seconds: a cold file cache is noise there, and a warm-up run is costly.
        measured[name] = wall(argv, runs, env, warm=runs == HELP_RUNS)
        print(f"{name}: median {median(measured[name]):.3f}s over {runs} runs")
    rows = [[name, runs, median(measured[name]), min(measured[name]), max(measured[name])]
            for name, _, runs, _ in cases]
    recipes = len(list((ROOT / "recipes").glob("*.yaml")))
    figures = [
        figure("rlkit --help wall time", median(measured["rlkit --help"]), "s", at_most=0.3, digits=3),
        figure("rlkit recipes validate wall time", median(measured[cases[-1][0]]), "s", digits=2,
               note=f"{recipes} shipped recipes; imports torch and trl and builds each TRL config"),
    ]
    write("help", "CLI response time", figures,
          [table("Wall time of fresh processes (seconds)", ["command", "runs", "median", "min", "max"], rows)],
          what="Wall time of `rlkit --help` and `rlkit recipes validate` run as fresh processes (interpreter "
               "start included), median of several runs; the rows without a target break `--help` down.",
          details={"seconds": measured})


if __name__ == "__main__":
    main()
