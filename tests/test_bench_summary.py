"""bench/run.py's summary page: it lists the benchmarks' results and skips other JSON in bench/results."""

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_summary_lists_the_benchmark_results_and_skips_other_json(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import run

    real = json.loads((BENCH / "results" / "help.json").read_text())  # a benchmark's own result, as written
    (tmp_path / "help.json").write_text(json.dumps(real))
    (tmp_path / "rss_calc12_trim.json").write_text(json.dumps({"samples": [[0.0, 1.2e9, 3]]}))  # a trace: no figures
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    page = run.summary({"help": 1.0})
    assert "[help](help.md)" in page and real["figures"][0]["figure"] in page
    assert "rss_" not in page and "took 1 s" in page
