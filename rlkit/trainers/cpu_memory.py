"""Hand memory freed by a CPU training step back to the OS (glibc), so RSS tracks live tensors.

Measured by ``bench/grpo_step.py`` (see bench/results/grpo_step.md): on CPU, a GRPO step of the smol
recipes sat at ~5.7 GB *between* phases and peaked at 6.8 GB, while its live tensors (135M weights, LoRA,
one step's activations and completion-only logits) need a fraction of that, and the peak grew every step.
The cause is glibc's allocator, not TRL: torch's CPU tensors come from ``malloc``; glibc raises its mmap
threshold each time a large mmapped block is freed (up to 32 MB), so after the first backward the
activations (many blocks of 1-30 MB) are carved out of the heap instead, and freed heap pages stay in
the process (and fragment as sequence lengths change from step to step).

``keep_heap_small()`` pins the mmap threshold (and the trim threshold) at 128 KiB through ``mallopt``:
every large tensor is its own mapping, returned to the OS when freed. It changes no number computed,
only where the memory comes from. A no-op off glibc (macOS, musl): returns False.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
THRESHOLD = 128 * 1024  # glibc's own starting value, kept fixed instead of growing


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_heap_small(threshold: int = THRESHOLD) -> bool:
    """Pin glibc's mmap and trim thresholds (process-wide, from now on); True when it took effect."""
    libc = _libc()
    if libc is None:
        return False
    done = libc.mallopt(M_MMAP_THRESHOLD, threshold) == 1 and libc.mallopt(M_TRIM_THRESHOLD, threshold) == 1
    libc.malloc_trim(0)  # what earlier work (model loading, an eval) left in the heap
    return done
