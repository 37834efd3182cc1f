"""Tracking (W&B offline fallback, TensorBoard, the recipe as the run's config) and secrets kept out of everything."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlkit import secrets, tracking
from rlkit.agents.endpoint import transport_failures
from rlkit.errors import UserError
from rlkit.recipe import load_recipe, recipes_dir
from tests.scripted_server import ScriptedServer

RLKIT = str(Path(sys.executable).parent / "rlkit")
SECRETS = {"WANDB_API_KEY": "wandb0123456789abcdef0123456789abcdef0123", "HF_TOKEN": "hf_SecretTokenValue12345",
           "OPENAI_API_KEY": "sk-env-secret-0987654321"}
FLAG_KEY = "sk-flag-secret-1122334455"


def _files_leaking(root: Path, values) -> list[str]:
    leaks = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaks += [f"{path}: {v[:6]}..." for v in values if v.encode() in data]
    return leaks


@pytest.mark.report
def test_wandb_goes_offline_tensorboard_logs_and_no_secret_is_written_anywhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    # A key, but no route to the W&B server: the run must go offline rather than stop.
    env.update(SECRETS, WANDB_BASE_URL="http://127.0.0.1:9", HOME=str(tmp_path / "home"), RLKIT_LOG_LEVEL="INFO")
    run_dir = tmp_path / "run"
    res = subprocess.run([RLKIT, "train", recipes_dir() / "tiny_arith_sft.yaml", "--smoke", "--output-dir", run_dir,
                          "--set", "trainer.report_to=[wandb, tensorboard]", "--set", "name=tracked"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"W&B: 127.0.0.1 is unreachable, so this run logs offline to {run_dir / 'wandb'}; upload it later with " \
           f"`wandb sync {run_dir / 'wandb' / 'offline-run-*'}`" in res.stderr
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert f"upload it with `wandb sync {offline}`" in res.stderr
    # The resolved recipe (with versions) is the W&B run's config, and TensorBoard's text summary.
    (events,) = offline.glob("run-*.wandb")
    data = events.read_bytes()
    assert b'"provenance"' in data and b'"tracked"' in data and b'"trl"' in data
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    board.Reload()
    assert [e.step for e in board.Scalars("train/loss")] == [1, 2]
    text = board.Tensors("rlkit/recipe/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "name: tracked" in text and "provenance:" in text
    assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "report.md").is_file()

    # A rollout with an --api-key flag; the server echoes a key into its error message for one episode.
    calls = []

    def reply(request):
        calls.append(request)
        if len(calls) == 1:
            return {"status": 400, "message": f"bad request from {FLAG_KEY}"}
        return {"content": "#### 4"}

    out = tmp_path / "rollouts" / "t.jsonl"
    with ScriptedServer(reply) as server:
        res2 = subprocess.run([RLKIT, "rollout", recipes_dir() / "gsm8k_calculator_grpo.yaml", "--smoke", "--endpoint",
                               server.url, "--api-key", FLAG_KEY, "--limit", "2", "--out", out],
                              capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in res2.stderr.splitlines() if line.startswith("rlkit: error: ")]
    assert res2.returncode == 2 and len(errors) == 1 and "Traceback" not in res2.stderr
    assert "bad request from ***" in errors[0]  # a fatal endpoint error, its message masked
    # The other episode may have finished first: it is kept, and the next run continues the file.
    first = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    with ScriptedServer(lambda request: {"status": 500, "message": f"overloaded for {FLAG_KEY}"}) as server:
        res2 = subprocess.run([RLKIT, "rollout", recipes_dir() / "gsm8k_calculator_grpo.yaml", "--smoke", "--endpoint",
                               server.url, "--api-key", FLAG_KEY, "--limit", "2", "--out", out, "--resume"],
                              capture_output=True, text=True, env=env, timeout=300)
    # Every episode this run tried failed on the endpoint: recorded and kept. The exit code is 1 when most of the
    # file's episodes failed so: both, unless the first run had kept the other episode's answer (a race).
    most_failed = sum(transport_failures(first).values()) == len(first)
    assert res2.returncode == (1 if most_failed else 0), res2.stderr
    assert ("2 of 2 episodes failed on endpoint errors" in res2.stderr) == most_failed, res2.stderr
    assert len(out.read_text().splitlines()) == 2
    assert "overloaded for ***" in out.read_text()  # recorded per episode, masked
    assert server.headers[0]["authorization"] == f"Bearer {FLAG_KEY}"
    values = [*SECRETS.values(), FLAG_KEY]
    assert _files_leaking(tmp_path / "run", values) == []
    assert _files_leaking(tmp_path / "rollouts", values) == []
    for stream in (res.stdout, res.stderr, res2.stdout, res2.stderr):
        assert not [v for v in values if v in stream]


def test_wandb_offline_reasons(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert tracking._wandb_offline_reason() == "no API key (set WANDB_API_KEY or run `wandb login`)"
    (tmp_path / "netrc").write_text("machine 127.0.0.1\n  login user\n  password k\n")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    assert tracking._wandb_offline_reason() == "127.0.0.1 is unreachable"  # the netrc key counts as a key
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking._wandb_offline_reason() == "WANDB_MODE is offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking._wandb_offline_reason() is None
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    assert tracking._wandb_offline_reason() is None  # reachable with a key: online
    listener.close()


@pytest.mark.parametrize("report_to, message", [
    ("[wandbb]", "trainer.report_to: unknown tracker 'wandbb'; use none or some of: "),
    ("[mlflow]", "trainer.report_to: mlflow is not installed; `pip install mlflow`, or drop it from report_to"),
])
def test_trackers_are_checked_with_the_trainer_block(report_to, message):
    # `rlkit train`, `recipes validate` and the launcher check the trainer block before any model loads.
    from rlkit.trainers import check_trainer

    bad = load_recipe(recipes_dir() / "tiny_arith_sft.yaml", [f"trainer.report_to={report_to}"], smoke=True)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_trainer(bad)
    check_trainer(load_recipe(recipes_dir() / "tiny_arith_sft.yaml", ["trainer.report_to=[tensorboard, wandb]"],
                              smoke=True))


def test_redact_scrub_and_the_log_filter(monkeypatch, caplog):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    secrets.register("sk-registered-123456")
    secrets.register("abc")  # too short to be told apart from ordinary text: ignored
    secrets.register("k3y!")  # a short key is still a key
    assert secrets.redact("token hf_abcdefghijklmnop and sk-registered-123456; abc k3y!") == \
        "token *** and ***; abc ***"
    config = {"trainer": {"hub_token": "hf_x", "learning_rate": 1e-5, "report_to": ["wandb"]},
              "endpoint": {"api_key": "k", "url": "http://h/?key=hf_abcdefghijklmnop"}, "name": "run",
              "max_tokens": 300, "empty_token": None}
    assert secrets.scrub(config) == {
        "trainer": {"hub_token": "***", "learning_rate": 1e-5, "report_to": ["wandb"]},
        "endpoint": {"api_key": "***", "url": "http://h/?key=***"}, "name": "run", "max_tokens": 300,
        "empty_token": None}
    logger = logging.getLogger("rlkit.test-secrets")
    logger.addFilter(secrets.RedactingFilter())
    with caplog.at_level(logging.INFO, logger="rlkit.test-secrets"):
        logger.info("calling with %s", "sk-registered-123456")
    assert caplog.records[-1].getMessage() == "calling with ***"


def test_the_resolved_recipe_masks_secret_fields(tmp_path):
    from rlkit import runs

    runs.write_resolved(tmp_path, {"name": "r", "trainer": {"hub_token": "hf_written_by_mistake"}}, {"smoke": True})
    doc = yaml.safe_load((tmp_path / "recipe.resolved.yaml").read_text())
    assert doc["trainer"]["hub_token"] == "***"
    assert "hf_written_by_mistake" not in (tmp_path / "recipe.resolved.yaml").read_text()
