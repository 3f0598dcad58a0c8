"""Giving the C heap's free pages back to the operating system.

CPython frees small objects into its own arenas, which it returns to the
system when empty; larger buffers (result rows, message bodies, a start-up's
declarations) come from glibc's ``malloc``, which keeps what was freed for
reuse. After the start-up and after a large batch, that is memory a beat
holds for nothing until the next burst: ``malloc_trim(0)`` returns it. Only
on glibc; elsewhere it does nothing.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("celery_routines.memory")

# A tick that handled at least this many windows is followed by a trim.
TRIM_AFTER_WINDOWS = 1000

_trim: Any = None


def release_free_memory() -> None:
    """``malloc_trim(0)`` on glibc (a few milliseconds); nothing elsewhere."""
    global _trim
    if _trim is None:
        _trim = _find_trim() or False
    if _trim:
        _trim(0)


def _find_trim() -> Any:
    try:
        import ctypes

        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, ImportError):
        logger.debug("no malloc_trim (not glibc): free memory stays with the allocator")
        return None
