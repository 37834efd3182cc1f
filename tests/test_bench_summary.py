"""bench/run.py's summary page: it lists the benchmarks' results and skips other JSON in bench/results."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def test_summary_lists_every_benchmark_result_and_skips_the_rss_traces():
    traces = sorted(RESULTS.glob("rss_*.json"))
    assert traces and all("figures" not in json.loads(p.read_text()) for p in traces)  # what used to crash it
    code = "import sys; sys.path.insert(0, 'bench'); import run; print(run.summary({}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    results = [p.stem for p in RESULTS.glob("*.json") if "figures" in json.loads(p.read_text())]
    assert results and all(f"[{name}]({name}.md)" in done.stdout for name in results)
    assert "rss_" not in done.stdout
