"""Every shipped recipe runs end to end with --smoke (tiny model, generated data, 2 steps, CPU)."""

import json
import time

import pytest

from rlkit.train import train
from tests.helpers import shipped_recipe_params


@pytest.mark.slow
@pytest.mark.parametrize("path", shipped_recipe_params())
def test_shipped_recipe_runs_with_smoke(path, tmp_path):
    started = time.time()
    run_dir = train(path, smoke=True, output_dir=tmp_path / "run")
    elapsed = time.time() - started
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 2
    print(f"smoke {path.stem}: {elapsed:.1f}s")
