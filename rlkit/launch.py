"""Several processes: hand ``rlkit train`` to ``accelerate launch``, and tell the ranks apart.

rlkit has no distributed runtime of its own. ``rlkit train RECIPE --num-processes N`` runs itself again as

    python -m accelerate.commands.launch [accelerate flags] -m rlkit train RECIPE [the other rlkit flags]

and accelerate (torchrun underneath) starts the ranks; TRL's trainer does data parallelism, DeepSpeed or FSDP.
Launching by hand works the same: ``accelerate launch -m rlkit train RECIPE``.

Without CUDA the ranks are CPU processes talking over gloo. accelerate's ``--cpu`` flag is no way there: it picks
accelerate's simple launcher, which starts ONE process whatever ``--num_processes`` says. rlkit uses the torchrun
launcher (``--multi_gpu``) instead, and the TRL config's ``use_cpu=True`` (rlkit's default on a machine without
CUDA) makes accelerate set up each rank as MULTI_CPU with the gloo backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from rlkit.errors import UserError

log = logging.getLogger("rlkit")

# rlkit's names for the accelerate configs TRL ships in ``trl/accelerate_configs/`` (``fsdp`` is TRL's FSDP2).
NAMED_CONFIGS = {"single_gpu": "single_gpu", "multi_gpu": "multi_gpu", "zero2": "zero2", "zero3": "zero3",
                 "fsdp": "fsdp2"}
_DEEPSPEED = ("zero2", "zero3")
_GPU_ONLY = (*_DEEPSPEED, "fsdp")
# rlkit's own launch flags (each takes a value): they configure accelerate and never reach the ranks.
LAUNCH_FLAGS = ("--num-processes", "--accelerate-config", "--num-machines", "--machine-rank", "--main-process-ip",
                "--main-process-port")
# Set in the environment of the processes rlkit launches, so they never launch again.
LAUNCHED_ENV = "RLKIT_LAUNCHED"


def config_path(name_or_path: str | Path) -> Path:
    """A config TRL ships, by rlkit's name (``zero2``), or an existing YAML file; found by ``trl.cli``'s resolver."""
    from rlkit.compat import trl_accelerate_config

    name = str(name_or_path)
    path = Path(name).expanduser()
    if name not in NAMED_CONFIGS and not path.is_file():
        raise UserError(f"--accelerate-config {name!r}: not a shipped config ({', '.join(NAMED_CONFIGS)}) "
                        "nor an existing accelerate config file")
    return trl_accelerate_config(NAMED_CONFIGS.get(name, str(path)))


_QLORA_SHARDED = ("load_in_4bit under {what} needs a model loaded without device_map and bnb_4bit_quant_storage "
                  "set to the compute dtype, which rlkit does not do; use --accelerate-config multi_gpu (each GPU "
                  "holds the 4-bit model) or set model.load_in_4bit=false")


def check_quantized(load_in_4bit: bool, config: str | Path | None) -> None:
    """No 4-bit base under a config that shards parameters: ZeRO-3 refuses a ``device_map`` (transformers 5.17
    integrations/accelerate.py:135) and sharded QLoRA needs ``bnb_4bit_quant_storage`` = the compute dtype."""
    what = sharding(config) if config is not None else None
    if what and load_in_4bit:
        raise UserError(f"--accelerate-config {config}: " + _QLORA_SHARDED.format(what=what))


def sharding(config: str | Path) -> str | None:
    """``"DeepSpeed ZeRO-3"`` or ``"FSDP"`` when the accelerate config shards parameters, else None."""
    import yaml

    data = yaml.safe_load(config_path(config).read_text()) or {}
    kind = str(data.get("distributed_type", "")).upper()
    if kind == "FSDP":
        return "FSDP"
    if kind == "DEEPSPEED" and int((data.get("deepspeed_config") or {}).get("zero_stage", 0)) == 3:
        return "DeepSpeed ZeRO-3"
    return None


def strip_launch_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` without rlkit's launch flags and their values (``--flag V`` and ``--flag=V`` alike)."""
    out: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
        elif arg in LAUNCH_FLAGS:
            skip_value = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in LAUNCH_FLAGS)):
            out.append(arg)
    return out


def launch_command(
    argv_rest: Sequence[str],
    *,
    num_processes: int | None = None,
    accelerate_config: str | Path | None = None,
    num_machines: int = 1,
    machine_rank: int = 0,
    main_process_ip: str | None = None,
    main_process_port: int | None = None,
    cpu: bool | None = None,
) -> list[str]:
    """The ``accelerate launch`` command that runs ``rlkit train`` with ``argv_rest`` in every rank.

    ``argv_rest`` is what followed ``train`` on the command line (recipe and options); rlkit's launch flags in it
    are dropped. ``num_processes`` counts processes on all machines together, as accelerate's flag does (default:
    every visible GPU on each machine; 1 without CUDA). ``cpu=None`` means "this machine has no CUDA".
    """
    if cpu is None:
        cpu = not _cuda_available()
    if num_processes is None:
        num_processes = 1 if cpu else max(_cuda_device_count(), 1) * num_machines
    _check(num_processes, accelerate_config, num_machines, machine_rank, main_process_ip, cpu)
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if accelerate_config is not None:
        cmd += ["--config_file", str(config_path(accelerate_config))]
    elif num_processes > 1:
        cmd.append("--multi_gpu")  # accelerate's torchrun launcher; on CPU too (see the module docstring)
    cmd += ["--num_processes", str(num_processes), "--num_machines", str(num_machines)]
    if num_machines > 1:
        cmd += ["--machine_rank", str(machine_rank), "--main_process_ip", str(main_process_ip)]
    if main_process_port is not None:
        cmd += ["--main_process_port", str(main_process_port)]
    if cpu or accelerate_config is None:
        # Leave precision to the recipe (TRL's bf16/fp16 fields): the named configs say bf16, which a CPU lacks.
        cmd += ["--mixed_precision", "no"]
    if accelerate_config is None:
        cmd += ["--dynamo_backend", "no"]
    return [*cmd, "-m", "rlkit", "train", *strip_launch_flags(argv_rest)]


def _check(num_processes: int, config: str | Path | None, num_machines: int, machine_rank: int,
           main_process_ip: str | None, cpu: bool) -> None:
    if num_processes < 1 or num_machines < 1:
        raise UserError("--num-processes and --num-machines must be at least 1")
    if num_processes % num_machines:
        raise UserError(f"--num-processes {num_processes} counts the processes of all {num_machines} machines "
                        "together, so it must be a multiple of --num-machines")
    if num_machines > 1 and not main_process_ip:
        raise UserError("--num-machines > 1 needs --main-process-ip (the address of the machine with rank 0)")
    if not 0 <= machine_rank < num_machines:
        raise UserError(f"--machine-rank {machine_rank}: must be between 0 and {num_machines - 1}")
    if str(config) == "single_gpu" and num_processes > 1:
        raise UserError("--accelerate-config single_gpu runs one process; use multi_gpu (or zero2, zero3, fsdp) "
                        "for several")
    if cpu and str(config) in _GPU_ONLY:
        raise UserError(f"--accelerate-config {config}: DeepSpeed and FSDP need CUDA GPUs and this machine has none; "
                        "leave --accelerate-config out to run CPU processes")


def relaunch(argv_rest: Sequence[str], **options) -> int:
    """Run ``rlkit train`` under ``accelerate launch`` (see :func:`launch_command`); return its exit code.

    The launcher runs in its own process group; SIGINT and SIGTERM sent to rlkit are passed on to that group.
    torchrun hands the signal to each rank (its ranks run in sessions of their own) and kills them 30 s later;
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (seconds) gives a slow checkpoint longer.
    """
    cmd = launch_command(argv_rest, **options)
    config = options.get("accelerate_config")
    if str(config) in _DEEPSPEED and not _installed("deepspeed"):
        raise UserError(f"--accelerate-config {config}: DeepSpeed is not installed; `pip install deepspeed`")
    log.info("launching: %s", shlex.join(cmd))
    proc = subprocess.Popen(cmd, env={**os.environ, LAUNCHED_ENV: "1"}, start_new_session=True)
    # To the ranks themselves (or, before they exist, the launcher's group): each finishes its step, checkpoints and
    # exits 0 (see cli.main), so torchrun neither reports a failure nor prints the traceback it raises when it gets
    # the signal itself.
    with forwarding_signals(lambda: _children(proc.pid) or [-proc.pid]) as forwarded:
        code = proc.wait()
    if code < 0:
        return 128 - code  # killed by signal N: the shell's 128 + N
    # Stopped on a signal: report it, as a single-process `rlkit train` does.
    return 128 + forwarded[0] if forwarded else code


def _children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (Linux /proc; empty elsewhere)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


@contextlib.contextmanager
def forwarding_signals(targets: Callable[[], list[int]]) -> Iterator[list[int]]:
    """While inside: SIGINT and SIGTERM sent to this process go to the pids ``targets()`` names when each arrives
    (a negative pid: that process group) instead of stopping it; yields the signals forwarded so far."""
    forwarded: list[int] = []

    def forward(signum, _frame):
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):  # already gone
            for pid in targets():
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield forwarded
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def setup_logging() -> None:
    """Rich log lines on a terminal; plain, unwrapped, timestamped lines in a log file or a pipe (every rlkit command,
    and each fresh process a demo runs a stage in)."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from rlkit.compat import quiet_bnb_kernels_hint
    from rlkit.progress import console, interactive
    from rlkit.secrets import RedactingFilter

    if interactive():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console(), show_path=False, show_time=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no tqdm bars (model loading, downloads)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.addFilter(RedactingFilter())
    if rank_info()[2] > 1:  # several processes: which rank says what; replicas only warn
        handler.addFilter(RankFilter())
    # force: a second main() in one process (the tests, the Python API) must not keep writing to the first
    # call's stderr, which may be closed by now.
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("rlkit").setLevel(os.environ.get("RLKIT_LOG_LEVEL", "INFO"))
    quiet_bnb_kernels_hint()  # third-party advice that never applies to rlkit (rlkit.compat says why)


def rank_info(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from the variables torchrun / accelerate set; ``(0, 0, 1)`` alone."""
    env = os.environ if env is None else env
    return int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1))


def is_main_process(env: Mapping[str, str] | None = None) -> bool:
    """Rank 0 (of all machines): the one process that writes the run directory, plots and reports."""
    return rank_info(env)[0] == 0


def already_launched(env: Mapping[str, str] | None = None) -> bool:
    """True inside ``accelerate launch`` / torchrun (or rlkit's own relaunch): launching again would nest."""
    env = os.environ if env is None else env
    # LOCAL_RANK: torchrun (accelerate's multi-GPU, DeepSpeed and FSDP launchers). ACCELERATE_DYNAMO_BACKEND:
    # set by every `accelerate launch` launcher, including the one-process one, which sets no rank variables.
    return any(key in env for key in (LAUNCHED_ENV, "LOCAL_RANK", "ACCELERATE_DYNAMO_BACKEND"))


class RankFilter(logging.Filter):
    """With several processes: prefix each record with ``[rank R/W]``, and keep replicas (rank > 0) quiet.

    Replicas pass only records at ``replica_level`` or above, or records logged with
    ``extra={"all_ranks": True}`` (say, each rank's share of the data). One process: records pass unchanged.
    """

    def __init__(self, rank: int | None = None, world_size: int | None = None,
                 replica_level: int = logging.WARNING) -> None:
        super().__init__()
        env_rank, _, env_world = rank_info()
        self.rank = env_rank if rank is None else rank
        self.world_size = env_world if world_size is None else world_size
        self.replica_level = replica_level

    def filter(self, record: logging.LogRecord) -> bool:
        if self.world_size <= 1:
            return True
        if self.rank > 0 and record.levelno < self.replica_level and not getattr(record, "all_ranks", False):
            return False
        if not getattr(record, "rlkit_rank_prefixed", False):  # one prefix, however many handlers see it
            record.msg = f"[rank {self.rank}/{self.world_size}] {record.msg}"
            record.rlkit_rank_prefixed = True
        return True


def barrier() -> None:
    """Wait for every process (a no-op for one)."""
    if rank_info()[2] > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
