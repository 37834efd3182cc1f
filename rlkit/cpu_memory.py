"""Hand memory freed by CPU training and generation back to the OS (glibc), so RSS tracks live tensors.

Measured by ``bench/grpo_step.py`` (see bench/results/grpo_step_history.md): on CPU, a GRPO step of the smol
recipes sat at ~5.7 GB *between* phases and peaked at 6.8 GB, while its live tensors (135M weights, LoRA,
one step's activations and completion-only logits) need a fraction of that, and the peak grew every step.
The cause is glibc's allocator, not TRL: torch's CPU tensors come from ``malloc``; glibc raises its mmap
threshold each time a large mmapped block is freed (up to 32 MB), so after the first backward the
activations (many blocks of 1-30 MB) are carved out of the heap instead, and freed heap pages stay in
the process (and fragment as sequence lengths change from step to step).

``keep_heap_small()`` pins the mmap and trim thresholds through ``mallopt``: every tensor at least that
large is its own mapping, returned to the OS when freed, while smaller ones keep glibc's fast heap. The
threshold trades memory for speed, because a fresh mapping is page-faulted in on first touch (four steps of
smol_arith_grpo with gradient checkpointing, 2 idle cores; bench/results/grpo_step_history.md):

    threshold       128 KiB   1 MiB   2 MiB   4 MiB (default)   8 MiB   glibc's own
    s per step         39       35      29          22            17         15
    peak RSS (GB)     2.08     2.13    2.21        2.70          3.45       3.79

Most of that cost is page faults (4 KiB pages, first touch); the CLI has torch back tensors of 2 MiB or more
with transparent huge pages (:func:`rlkit.compat.torch_huge_pages`), which halves the step time: 32 instead
of 60 s a step of the recipe's 32 sequences at 4 MiB, against 24 s at glibc's own thresholds with 2.3 times the
memory.

``RLKIT_MMAP_THRESHOLD_KB`` chooses another (``128`` for the smallest footprint, ``0`` leaves glibc alone).
It changes no number computed, only where the memory comes from. A no-op off glibc (macOS, musl).

Blocks under the threshold still come from the heap, and the heap pages they once used stay resident: the
calculator's floor between steps rose 1.34 -> 1.60 GB over 12 steps, in steps of ~0.06 GB, as longer batches
arrived. ``trim_each_step()`` is a TrainerCallback that calls ``malloc_trim(0)`` after an optimizer step that
left the process 64 MiB or more above where the last trim left it, returning every free heap page (not only the
top of the heap) to the OS.

Generation (evals, agent rollouts; :func:`rlkit.inference.generate.generate_ids`) runs the same check after every
batch: a KV cache grown token by token and prompt passes of every length leave freed blocks of every size in
the heap. The search demo's HotpotQA eval (100 episodes of up to 1,019-token prompts, batches of 16, eager
attention) climbed from 1.9 GB after loading to a 4.37 GB peak that way (4 min 50 s), 2.96 GB with the check
(4 min 40 s; peaks by `time -v`, measured on 8e9b126), with the same answers; pinning the threshold at
64 KiB instead kept it at 2.33 GB but took 9 min. ``RLKIT_MMAP_THRESHOLD_KB=0`` turns this off too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from typing import Any

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
THRESHOLD = 4 * 2**20  # kept fixed instead of growing to 32 MiB as freed mappings raise it
ENV = "RLKIT_MMAP_THRESHOLD_KB"
RELAXED_MMAP = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_MIN_GROWTH = 64 * 2**20  # a step-end trim runs only when RSS grew this much since the last one


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_heap_small(threshold: int | None = None) -> bool:
    """Pin glibc's mmap and trim thresholds (process-wide, from now on) at ``threshold`` bytes (default: the
    environment's ``RLKIT_MMAP_THRESHOLD_KB``, else 4 MiB); True when it took effect."""
    if threshold is None:
        threshold = threshold_from_env()
    libc = _libc()
    if libc is None or threshold == 0:
        return False
    done = libc.mallopt(M_MMAP_THRESHOLD, threshold) == 1 and libc.mallopt(M_TRIM_THRESHOLD, threshold) == 1
    libc.malloc_trim(0)  # what earlier work (model loading, an eval) left in the heap
    return done


@contextlib.contextmanager
def small_heap(active: bool = True, trainer: Any = None) -> Iterator[bool]:
    """``keep_heap_small()`` for the block (training), then the thresholds glibc's own adjustment would have
    reached (mmap 32 MiB, trim 64 MiB): a fixed small threshold would slow every later step of the process
    (an eval after training ran ~3x slower in `make demo-calc`), and glibc cannot go back to adjusting it.
    With a ``trainer``, the heap is also trimmed after its steps that left 64 MiB or more (:func:`trim_each_step`)."""
    took = active and keep_heap_small()
    if took and trainer is not None and (trim := trim_each_step()) is not None:
        trainer.add_callback(trim)
    try:
        yield took
    finally:
        if took:
            libc = _libc()
            libc.mallopt(M_MMAP_THRESHOLD, RELAXED_MMAP)
            libc.mallopt(M_TRIM_THRESHOLD, 2 * RELAXED_MMAP)
            libc.malloc_trim(0)


def resident_bytes() -> int:
    """This process's resident set size, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class HeapTrimmer:
    """Hands the heap's free pages back to the OS (``malloc_trim(0)``: 79 ms to return 1.2 GB of freed 2 MB
    blocks) whenever the process has grown ``min_growth`` bytes past where the last trim left it. Between calls
    the process then sits at most that much above its trimmed floor, and work that freed little is not trimmed:
    every page a trim returns is faulted back in when it is used again (1,200 tiny-model SFT steps were trimmed
    1,200 times, now once)."""

    def __init__(self, libc: Any, min_growth: int = TRIM_MIN_GROWTH) -> None:
        self.libc, self.min_growth = libc, min_growth
        self.floor = resident_bytes()

    def trim(self) -> None:
        self.libc.malloc_trim(0)
        self.floor = resident_bytes()

    def check(self) -> None:
        now = resident_bytes()
        if now - self.floor >= self.min_growth:
            self.trim()
        else:  # where the process shrank on its own (freed mappings, glibc's top-of-heap trim), count from there
            self.floor = min(self.floor, now)


def heap_trimmer() -> HeapTrimmer | None:
    """A :class:`HeapTrimmer` for one generation call, its floor where the call starts; None off glibc, or where
    ``RLKIT_MMAP_THRESHOLD_KB=0`` leaves glibc alone. One trimmer for the whole process instead (one floor across
    an agent eval's turns, each a call) was tried on the HotpotQA eval below: 3.28 GB against 2.96, one run each."""
    libc = _libc()
    return None if libc is None or threshold_from_env() == 0 else HeapTrimmer(libc)


def trim_each_step(min_growth: int = TRIM_MIN_GROWTH) -> Any:
    """A TrainerCallback running a :class:`HeapTrimmer` at the end of every optimizer step (and once before the
    first); None off glibc."""
    libc = _libc()
    if libc is None:
        return None
    from transformers import TrainerCallback

    class TrimHeap(TrainerCallback):
        def __init__(self) -> None:
            self.trimmer = HeapTrimmer(libc, min_growth)

        # Also before the first step: a step-0 agent eval (rlkit.evaluate.during, which runs first) leaves its
        # generation's freed heap behind, which the first step's peak would otherwise sit on.
        def on_train_begin(self, args, state, control, **kwargs):
            self.trimmer.trim()

        def on_step_end(self, args, state, control, **kwargs):
            self.trimmer.check()

    return TrimHeap()


def threshold_from_env() -> int:
    """The mmap threshold in bytes from ``RLKIT_MMAP_THRESHOLD_KB`` (default 4 MiB; 0: leave glibc alone); a bad
    value is a UserError. The CLI reads it first thing, so a bad value stops a command before any work."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return THRESHOLD
    if not raw.isdigit() or int(raw) > 32 * 1024:  # glibc's HEAP_MAX for the mmap threshold: 32 MiB
        from rlkit.errors import UserError

        raise UserError(f"{ENV}={raw!r}: give kilobytes from 0 (leave glibc's allocator alone) to 32768; "
                        "128 keeps memory smallest, larger trains faster")
    return int(raw) * 1024
