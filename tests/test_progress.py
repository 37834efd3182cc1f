"""Progress: a rich bar with step, ETA and key metrics on a terminal; one log line per logging step otherwise."""

import io

from rich.console import Console

from rlkit import progress
from rlkit.recipe import recipes_dir
from rlkit.train import train


def test_training_off_a_terminal_logs_one_line_per_logging_step(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(progress, "interactive", lambda: False)
    with caplog.at_level("INFO", logger="rlkit"):
        train(recipes_dir() / "tiny_arith_sft.yaml", ["trainer.max_steps=3"], smoke=True, output_dir=tmp_path / "r")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all("loss " in line and "tok acc " in line and " elapsed, " in line and " left)" in line for line in lines)


def test_training_on_a_terminal_draws_a_bar_with_metrics(tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(progress, "console", lambda: Console(file=screen, force_terminal=True, width=160))
    train(recipes_dir() / "tiny_arith_grpo.yaml", ["trainer.max_steps=2"], smoke=True, output_dir=tmp_path / "r")
    text = screen.getvalue()
    assert "grpo tiny_arith_grpo" in text and "2/2" in text and "reward " in text and "eta" in text


def test_bars_draw_only_on_a_terminal(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(progress, "console", lambda: Console(file=screen, force_terminal=True, width=100))
    monkeypatch.setattr(progress, "interactive", lambda: False)
    with progress.bar("rollouts", 3) as advance:
        advance()
    assert screen.getvalue() == ""
    monkeypatch.setattr(progress, "interactive", lambda: True)
    with progress.bar("rollouts", 3) as advance:
        for _ in range(3):
            advance()
    assert "rollouts" in screen.getvalue() and "3/3" in screen.getvalue()
    assert progress.summarize({"loss": 0.51234, "reward": 1.5, "reward_std": 0.25, "step": 3}) == \
        "loss 0.512  reward 1.5  ± 0.25"
