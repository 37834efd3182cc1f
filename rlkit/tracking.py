"""Experiment tracking: the recipe's ``trainer.report_to`` handed to transformers, made safe offline.

transformers' own callbacks do the logging (W&B, TensorBoard, ...). rlkit adds what a run on a
laptop or an air-gapped node needs:

* W&B without an API key, or without a route to its server, logs in offline mode into
  ``RUN/wandb/`` instead of stopping the run, and says how to upload it later (``wandb sync``).
* TensorBoard logs into ``RUN/tensorboard/``.
* The resolved recipe and the package versions are the tracked run's config.

``metrics.jsonl`` in the run directory is written whatever ``report_to`` says (see ``runs``).
"""

from __future__ import annotations

import importlib.util
import logging
import netrc
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rlkit.errors import UserError

log = logging.getLogger("rlkit")

_PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow", "trackio": "trackio",
             "comet_ml": "comet_ml", "clearml": "clearml", "neptune": "neptune", "dvclive": "dvclive"}


def check(report_to: list[str], source: str = "<recipe>") -> None:
    """Refuse an integration transformers does not know, or one whose package is not installed."""
    from rlkit.compat import known_trackers

    trackers = known_trackers()
    for name in report_to:
        if name not in trackers:
            known = ", ".join(sorted(trackers))
            raise UserError(f"{source}: trainer.report_to: unknown tracker {name!r}; use none or some of: {known}")
        package = _PACKAGES.get(name, name)
        if name == "tensorboard":
            from transformers.integrations import is_tensorboard_available

            if not is_tensorboard_available():  # tensorboard or tensorboardX, as its callback takes either
                raise UserError(f"{source}: trainer.report_to: tensorboard is not installed; "
                                "`pip install tensorboard`, or drop it from report_to")
        elif importlib.util.find_spec(package) is None:
            raise UserError(f"{source}: trainer.report_to: {name} is not installed; "
                            f"`pip install {package}`, or drop it from report_to")


def prepare(report_to: list[str], run_dir: Path, main: bool = True) -> dict[str, str]:
    """Point the trackers at the run directory before the trainer starts; returns {tracker: where it logs}.

    Every process sets the same environment; only the ``main`` one (which alone logs) says so.
    """
    where: dict[str, str] = {}
    if "wandb" in report_to:
        os.environ.setdefault("WANDB_PROJECT", "rlkit")
        os.environ["WANDB_DIR"] = str(run_dir.resolve())  # wandb writes RUN/wandb/
        if main:
            (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        offline = _wandb_offline_reason()
        if offline:
            os.environ["WANDB_MODE"] = "offline"
            say = log.warning if main else log.debug
            say("W&B: %s, so this run logs offline to %s; upload it later with `wandb sync %s`",
                offline, run_dir / "wandb", run_dir / "wandb" / "offline-run-*")
            where["wandb"] = f"offline, {run_dir / 'wandb'}"
        else:
            where["wandb"] = f"online, project {os.environ['WANDB_PROJECT']}"
    if "tensorboard" in report_to:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / "tensorboard")
        where["tensorboard"] = str(run_dir / "tensorboard")
    return where


def _wandb_offline_reason() -> str | None:
    """Why W&B cannot log online from here (None when it can)."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("offline", "dryrun"):
        return "WANDB_MODE is offline"
    if mode == "disabled":
        return None
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urlparse(base).hostname or "api.wandb.ai"
    if not os.environ.get("WANDB_API_KEY") and not _netrc_has(host):
        return "no API key (set WANDB_API_KEY or run `wandb login`)"
    port = urlparse(base).port or (80 if base.startswith("http://") else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return f"{host} is unreachable"
    return None


def _netrc_has(host: str) -> bool:
    path = os.environ.get("NETRC") or Path.home() / ".netrc"
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def config_callback(trainer: Any, resolved: dict[str, Any]) -> Any:
    """A TrainerCallback giving the trackers the resolved recipe (versions included) as the run's config.

    It must be added after transformers' own tracker callbacks, whose ``on_train_begin`` opens the runs.
    """
    from transformers import TrainerCallback

    class RecipeConfig(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            if "wandb" in args.report_to:
                import wandb

                if wandb.run is not None:
                    wandb.run.config.update({"rlkit": resolved}, allow_val_change=True)
            if "tensorboard" in args.report_to:
                import yaml
                from transformers.integrations import TensorBoardCallback

                from rlkit.compat import tensorboard_writer

                for cb in trainer.callback_handler.callbacks:
                    writer = tensorboard_writer(cb) if isinstance(cb, TensorBoardCallback) else None
                    if writer is not None:
                        text = yaml.safe_dump(resolved, sort_keys=False)
                        writer.add_text("rlkit/recipe", f"```yaml\n{text}\n```")

    return RecipeConfig()


def wandb_offline_dir(run_dir: Path) -> Path | None:
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    return runs[-1] if runs else None
