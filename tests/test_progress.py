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


def drive(callback, tmp_path, logs, max_steps):
    """What the Trainer does with a callback over ``max_steps`` steps, one ``logs`` dict logged per step."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=max_steps)
    state, control = TrainerState(max_steps=max_steps), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in range(1, max_steps + 1):
        state.global_step = step
        callback.on_step_end(args, state, control)
        callback.on_log(args, state, control, logs=logs)
    callback.on_log(args, state, control, logs={"train_runtime": 1.0, "train_loss": logs["loss"]})
    callback.on_train_end(args, state, control)


def test_training_on_a_terminal_draws_a_bar_with_metrics(tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(progress, "console", lambda: Console(file=screen, force_terminal=True, width=160))
    grpo_logs = {"loss": 0.01, "reward": 0.25, "reward_std": 0.1, "kl": 0.002, "completions/mean_length": 21.5}
    drive(progress.training_callback("grpo tiny_arith_grpo"), tmp_path, grpo_logs, max_steps=2)
    text = screen.getvalue()
    assert "grpo tiny_arith_grpo" in text and "2/2" in text and "reward 0.25" in text and "eta" in text


def test_off_a_terminal_each_step_logs_its_metrics_and_the_final_summary_row_does_not(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(progress, "interactive", lambda: False)
    callback = progress.training_callback("sft")
    with caplog.at_level("INFO", logger="rlkit"):
        drive(callback, tmp_path, {"loss": 0.5, "mean_token_accuracy": 0.25}, max_steps=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    assert all("loss 0.5  tok acc 0.25  (" in line and line.endswith(" left)") for line in lines)
    assert lines[-1].endswith("0m00s left)")


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


def test_a_time_limited_run_counts_time_left_against_its_limit_not_max_steps(tmp_path, caplog, monkeypatch):
    """`rlkit train --max-minutes` (the demos' equal-time control) sets max_steps out of reach: the log line and
    the bar count down the limit instead of printing hundreds of hours left."""
    from types import SimpleNamespace

    monkeypatch.setattr(progress, "interactive", lambda: False)
    callback = progress.training_callback("sft")
    progress.set_time_limit(SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[object(), callback])), 10)
    with caplog.at_level("INFO", logger="rlkit"):
        drive(callback, tmp_path, {"loss": 0.5}, max_steps=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1", "2"]
    assert all(line.endswith(" left of the 10m00s limit)") and line.split()[-6] in ("9m59s", "10m00s")
               for line in lines), lines
    screen = io.StringIO()
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(progress, "console", lambda: Console(file=screen, force_terminal=True, width=120))
    callback = progress.training_callback("sft")
    progress.set_time_limit(SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[callback])), 10)
    drive(callback, tmp_path, {"loss": 0.5}, max_steps=2)
    assert "2/?" in screen.getvalue() and "/2 " not in screen.getvalue()
