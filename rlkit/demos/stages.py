"""What every demo shares: the checks before any work (:func:`prepare`), the stage timer with the closing
tables, ``table.md`` and ``demo.json`` (:class:`Stages`), one line and the signal's exit code for a demo stopped
in any stage (:func:`stops_named`), and the evals copied into the trained run (:func:`copy_evals`)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlkit.errors import Interrupted

GAIN_CAPTION = ("gain: the paired difference on the same problems, its 95% bootstrap interval and exact McNemar "
                "p; * = significant at 5%")


def prepare(output_dir: Path, recipes: list[tuple[Path, list[str]]]) -> Path:
    """Before any work: each (recipe, overrides) loads and builds its TRL config, and ``output_dir`` is a
    place a demo may write (never the cwd, $HOME, a repo root or a symlink; a ``demo.json`` or
    ``gsm8k_easiest.jsonl`` already there is one a demo wrote). Returns the folder; one that did not exist is
    created and marked as rlkit's. A bad ``--set`` or folder is one line and leaves nothing behind."""
    from rlkit import safety
    from rlkit.recipe import load_recipe
    from rlkit.trainers import check_trainer

    for recipe, overrides in recipes:
        check_trainer(load_recipe(recipe, overrides), str(recipe))
    output_dir = safety.check_target(output_dir, "--output-dir")
    safety.check_replaceable_file(output_dir / "demo.json", "--output-dir", ("rows", "stages"))
    safety.check_replaceable_file(output_dir / "gsm8k_easiest.jsonl", "--output-dir", ("question", "answer"))
    if output_dir.is_dir():  # reused as it is: a folder rlkit did not create never gets its ownership mark
        return output_dir
    return safety.make_dir(output_dir, "demo")


def machine_overrides(console: Any) -> list[str]:
    """``model.dtype=float32`` for the SmolLM2 demos with no GPU and no bf16 matmul units (AVX512-BF16, AMX), where
    their recipes' bf16 is emulated, 5-20x slower (docs/performance.md); the user's own ``--set``s go after it."""
    from rlkit.backends import cuda_available
    from rlkit.inference.fastgen import cpu_has_native_bf16

    if cuda_available() or cpu_has_native_bf16():
        return []
    console.print("no bf16 matmul units (AVX512-BF16, AMX) in this CPU: the demo runs in float32, 5-20x faster here")
    return ["model.dtype=float32"]


def peak_rss_gb(children: bool = True) -> float:
    """The peak resident memory so far (GB, 1e9 bytes, to 3 decimals) of this process or of any child it waited for:
    ``/usr/bin/time -v``'s "Maximum resident set size" for the whole demo (the largest one process, not a sum). As
    there, a child's figure starts at its spawner's peak (Linux carries it across exec; Python spawns by vfork): none
    from ``make`` or a shell, a large Python process's own from one. ``children=False``: this process's alone."""
    import resource

    whose = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if children else (resource.RUSAGE_SELF,)
    return round(max(maxrss_bytes(who) for who in whose) / 1e9, 3)


class ChildTraceback(Exception):
    """Where an exception raised in a fresh process came from: its traceback there, as text."""


class Stopped(BaseException):
    """A stage ended by a signal: SIGTERM to this process (:func:`stops_named` raises it, as Python raises
    KeyboardInterrupt for SIGINT), or the signal a fresh stage's process died of: ``sent`` when it is one this process
    got and passed on, not when something else killed it (SIGKILL: most often the out-of-memory killer)."""

    def __init__(self, signum: int, sent: bool = True) -> None:
        super().__init__(signum, sent)
        self.signum, self.sent = signum, sent


def _raise_stopped(signum: int, _frame: Any) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stops_named(name: str) -> Iterator[None]:
    """Inside: SIGTERM stops this process as Ctrl-C does, with an exception rather than a silent death; either, or
    a stage process killed by a signal, ends as :class:`rlkit.errors.Interrupted` naming ``name`` (one line from
    the CLI, exit 128 + the signal's number, no traceback). A training stage's own ``Interrupted`` (it saved a
    checkpoint and says how to resume) keeps its message behind ``name``; one already named passes unchanged."""
    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread only
    previous = signal.signal(signal.SIGTERM, _raise_stopped) if main else None
    try:
        yield
    except Interrupted as e:
        if getattr(e, "stage", None) is not None:
            raise
        raise _named(name, str(e), e.exit_code) from None
    except KeyboardInterrupt:
        raise _named(name, "stopped by SIGINT before it finished", 128 + signal.SIGINT) from None
    except Stopped as e:
        signame = signal.Signals(e.signum).name
        why = (f"stopped by {signame} before it finished" if e.sent else
               f"its process was killed by {signame} before it finished"
               + (" (most often the out-of-memory killer: see `dmesg`)" if e.signum == signal.SIGKILL else ""))
        raise _named(name, why, 128 + e.signum) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _named(name: str, message: str, exit_code: int) -> Interrupted:
    stopped = Interrupted(f"{name}: {message}", exit_code)
    stopped.stage = name
    return stopped


def call_fresh(work: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``work(*args, **kwargs)`` in a fresh Python process (spawned: nothing of this one's heap, imports or state);
    returns its value and that process's own peak resident size in bytes. ``work``, its arguments and its value
    cross by pickle, so ``work`` must be importable (a module-level function or a ``functools.partial`` of one); its
    exception is raised here, its traceback there chained as the cause. Like ``multiprocessing``, a script that calls
    this needs the ``if __name__ == "__main__":`` guard.

    The process logs as rlkit's commands do, runs in its own process group and gets SIGINT and SIGTERM from this one,
    once each (Ctrl-C at the terminal reaches this process only), so a training stage checkpoints, stops and says how
    to resume; on Linux it gets SIGTERM if this process dies. Its death by a signal unheard raises :class:`Stopped`."""
    import multiprocessing

    from rlkit.launch import forwarding_signals

    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(target=_fresh_main, args=(send, os.getpid(), work, args, kwargs), daemon=False)
    child.start()
    send.close()
    with forwarding_signals(lambda: [child.pid]) as forwarded:
        try:
            ok, payload = receive.recv()
        except EOFError:  # it died without a word: of a signal (one passed on, or SIGKILL from outside), or crashed
            child.join()
            if child.exitcode is not None and child.exitcode < 0:
                raise Stopped(-child.exitcode, sent=-child.exitcode in forwarded) from None
            what = getattr(getattr(work, "func", work), "__name__", type(work).__name__)  # a partial: its function's
            raise RuntimeError(f"{what}: its process ended with exit code {child.exitcode} and no result") from None
        child.join()
    if ok:
        return payload
    error, where = payload
    raise error from ChildTraceback(where)


def _fresh_main(send: Any, parent: int, work: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
    from rlkit.launch import setup_logging

    os.setpgrp()  # the terminal's Ctrl-C goes to the parent, which passes it on once
    # Python ignores SIGINT when it started ignored (a background job, a test worker): this process answers the one
    # the parent passes on, as a command would; SIGTERM as the system's default until a trainer installs its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGTERM when the parent dies
        if os.getppid() != parent:  # it died before that
            os._exit(128 + signal.SIGTERM)
    setup_logging()
    try:
        result = (True, (work(*args, **kwargs), own_peak_bytes()))
    except BaseException as e:  # noqa: BLE001 - every exception goes back to the parent, which raises it
        result = (False, (e, traceback.format_exc()))
    try:
        send.send(result)
    except Exception:  # an exception that does not pickle: its text and traceback still go back
        send.send((False, (RuntimeError(f"{type(result[1][0]).__name__}: {result[1][0]}"), result[1][1])))


def own_peak_bytes() -> int:
    """Own peak RSS: Linux's ``VmHWM`` (since exec; ``ru_maxrss`` starts at the spawner's), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except FileNotFoundError:  # macOS: no /proc
        import resource

        return maxrss_bytes(resource.RUSAGE_SELF)


def maxrss_bytes(who: int) -> int:
    """``getrusage(who).ru_maxrss`` in bytes (macOS counts bytes, Linux kB)."""
    import resource

    peak = resource.getrusage(who).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def copy_evals(eval_dir: Path, run_dir: Path) -> None:
    """Every stage's results and episodes (``eval_dir``) into ``run_dir/eval``, their times kept, so that the
    trained run's ``report.md`` shows all stages, played order included, from the run directory alone."""
    (run_dir / "eval").mkdir(exist_ok=True)
    for path in [*eval_dir.glob("*.json"), *eval_dir.glob("*.trajectories.jsonl")]:
        shutil.copy2(path, run_dir / "eval" / path.name)


def train_minutes(run_dir: Path) -> float:
    """How long a run's training loop took (transformers' ``train_runtime``, model loading not counted)."""
    from rlkit.runs import read_metrics

    return next(r["train_runtime"] for r in reversed(read_metrics(run_dir)) if "train_runtime" in r) / 60


def control_overrides(overrides: list[str], sft_dir: Path | None, pool: dict[str, Any] | None = None) -> list[str]:
    """The equal-time control a user would ask for: the SFT recipe continued from ``sft_dir`` (None: the base) on
    ``pool`` (the RL stage's ``data.train``; None: the SFT's own data), its learning rate held constant, until
    ``rlkit train --max-minutes`` (the RL stage's minutes) ends it."""
    data = [f"data.train={json.dumps(pool)}"] if pool is not None else []
    return [*overrides, *([f"init_from={json.dumps(str(sft_dir))}"] if sft_dir else []), *data,
            "trainer.max_steps=100000", "trainer.lr_scheduler_type=constant", "trainer.warmup_steps=0",
            "trainer.save_steps=100000"]


class Stages:
    """Times each stage of a demo and prints it with the 1-minute load average before and after (on a shared
    machine the times say as much about the neighbours as about rlkit) and the peak resident memory so far."""

    def __init__(self, console: Any) -> None:
        self.console, self.rows, self.started = console, [], time.time()
        # What a shared check (rlkit.demos.ifeval) adds: more keys for demo.json, more tables for the close.
        self.extra: dict[str, Any] = {}
        self.tables: list[Any] = []
        self.shown: list[Any] = []  # the demo's own results tables, printed as they come (show)
        self.reference: dict[str, float] = {}  # each stage's seconds on a reference machine (expect)
        self.paced = False

    def expect(self, reference: dict[str, float], measured: str) -> None:
        """Say how long the demo should take: ``reference`` holds each stage's seconds as ``measured`` (a machine and
        commit); once the first of them has run here, the rest is scaled by how this machine kept pace with it."""
        self.reference = reference
        self.console.print(f"expected time: about {_minutes(sum(reference.values()))} ({measured}); "
                           "the estimate for this machine follows the first stage")

    def _pace(self, name: str, seconds: float) -> None:
        if self.paced or self.reference.get(name, 0) < 10:  # the first stage long enough to tell
            return
        self.paced, pace = True, seconds / self.reference[name]
        left = sum(v for k, v in self.reference.items() if k not in {r["stage"] for r in self.rows}) * pace
        self.console.print(f"this machine ran {name} at {pace:.1f}x the reference time: about {_minutes(left)} to go")

    def show(self, table: Any) -> None:
        """Print a results table (:func:`rlkit.evaluate.show.results_table`: whole at any width) now; :meth:`finish`
        writes it to ``table.md`` with the checks' tables."""
        self.console.print(table)
        self.shown.append(table)

    def run(self, name: str, work: Callable[[], Any]) -> Any:
        """``work()`` in this process, timed."""
        return self._timed(name, lambda: (work(), None))

    def run_fresh(self, name: str, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``work(*args, **kwargs)`` in a fresh process (:func:`call_fresh`: nothing the demo loaded; its memory back
        to the OS at its end), timed. The row adds that process's own peak (``stage_peak_rss_gb``) and this one's size
        at its start (``demo_rss_gb``): their sum bounds what both held at once (each counts shared libraries)."""
        import psutil  # accelerate's dependency: this process's size on any OS

        held = psutil.Process().memory_info().rss

        def call() -> tuple[Any, dict[str, float]]:
            value, own = call_fresh(work, *args, **kwargs)
            return value, {"stage_peak_rss_gb": round(own / 1e9, 3), "demo_rss_gb": round(held / 1e9, 3)}

        return self._timed(name, call)

    def _timed(self, name: str, work: Callable[[], tuple[Any, dict[str, float] | None]]) -> Any:
        load_before, t = os.getloadavg()[0], time.time()
        with stops_named(name):
            value, own = work()
        peak = peak_rss_gb()
        self.rows.append({"stage": name, "seconds": round(time.time() - t, 1),
                          "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                          "peak_rss_gb": peak, **(own or {})})
        fresh = (f"its own process's peak {_gb(own['stage_peak_rss_gb'])}, the demo's "
                 f"{_gb(own['demo_rss_gb'])} meanwhile; " if own else "")
        self.console.print(f"[dim]{name}: {self.rows[-1]['seconds']:.0f}s (1-min load average "
                           f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
                           f"{fresh}peak RSS so far {_gb(peak)})[/]")
        self._pace(name, self.rows[-1]["seconds"])
        return value

    def finish(self, rows: list[dict[str, Any]], output_dir: Path) -> dict[str, Any]:
        """Print the checks' tables, the time per stage, the total and the peak resident memory; write every results
        table as Markdown (``output_dir/table.md``) and write and return the summary (``output_dir/demo.json``)."""
        from rlkit import safety
        from rlkit.evaluate.show import write_markdown

        for table in self.tables:
            self.console.print(table)
        self.console.print(self.table())
        total, peak = time.time() - self.started, peak_rss_gb()
        together = max([peak_rss_gb(children=False)] + [
            round(s["stage_peak_rss_gb"] + s["demo_rss_gb"], 3) for s in self.rows if "stage_peak_rss_gb" in s])
        at_once = f" (at most {_gb(together)} at once, a stage's process and the demo's)" if together > peak else ""
        write_markdown(output_dir / "table.md", [*self.shown, *self.tables])
        cpu = cpu_model()
        self.console.print(f"total {total:.0f}s on {os.cpu_count()} CPUs ({cpu}), peak resident memory "
                           f"{_gb(peak)}{at_once}; the runs, evals and predictions are in {output_dir}/ "
                           "(the tables: table.md)")
        summary = {"rows": rows, **self.extra, "stages": self.rows, "total_seconds": round(total, 1),
                   "cpus": os.cpu_count(), "cpu": cpu, "peak_rss_gb": peak,
                   "peak_rss_at_once_gb": max(peak, together)}
        safety.write_text(output_dir / "demo.json", json.dumps(summary, indent=2))
        return summary

    def table(self) -> Any:
        from rich.table import Table

        times = Table(title="time per stage")
        fresh = any("stage_peak_rss_gb" in s for s in self.rows)
        for col in ("stage", "seconds", "1-min load before", "after", "peak RSS so far",
                    *(("own process's peak", "demo's meanwhile") if fresh else ())):
            times.add_column(col, justify="left" if col == "stage" else "right")
        for s in self.rows:
            own = [_gb(s[k]) if k in s else "" for k in ("stage_peak_rss_gb", "demo_rss_gb")] if fresh else []
            times.add_row(s["stage"], f"{s['seconds']:.0f}", f"{s['load_before']:.1f}", f"{s['load_after']:.1f}",
                          _gb(s["peak_rss_gb"]), *own)
        return times


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's name and its bf16 matmul units (``amx_bf16``, ``avx512_bf16``): stage times, and bf16 results near a
    tie, are comparable only between machines that share both (docs/demos.md: AMX on and off). A limit put on oneDNN
    (``ONEDNN_MAX_CPU_ISA=AVX2``: no bf16 units for torch) is named with them."""
    name, flags = platform.processor() or platform.machine(), []
    with contextlib.suppress(OSError):
        info = cpuinfo.read_text().splitlines()
        name = next((line.partition(":")[2].strip() for line in info if line.startswith("model name")), name)
        have = next((line.partition(":")[2].split() for line in info if line.startswith("flags")), [])
        flags = [f for f in ("amx_bf16", "avx512_bf16") if f in have]
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        flags.append(f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}")
    return f"{name} ({', '.join(flags)})" if flags else name


def _gb(value: float) -> str:
    return f"{value:.2f} GB"


def _minutes(seconds: float) -> str:
    return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
