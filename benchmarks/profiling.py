"""pyinstrument profiles of our tick and burst, summarised for the docs.

``summarise`` writes pyinstrument's own tree (frames over 1%) to a text file
and returns the inclusive share of wall time of the functions that matter:
every frame in ``celery_routines`` and the library calls it makes.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

# Library frames worth naming next to ours: where the tick's time really goes.
LIBRARY_MARKERS = (
    "sqlalchemy/engine/base.py:_execute_context",
    "sqlalchemy/engine/base.py:_exec_single_context",
    "sqlalchemy/sql/compiler.py",
    "sqlalchemy/engine/default.py:_init_compiled",
    "psycopg/cursor.py:execute",
    "psycopg/cursor.py:executemany",
    "celery/app/base.py:send_task",
    "celery/app/amqp.py:as_task_v2",
    "kombu/messaging.py:publish",
    "kombu/messaging.py:_publish",
    "redis/client.py:execute",
    "redis/connection.py:read_response",
    "dataclasses.py:asdict",
    "uuid.py:uuid4",
    "json/__init__.py:dumps",
    "logging/__init__.py:info",
)


def _walk(frame: Any, stack: tuple[str, ...], totals: dict[str, float]) -> None:
    ident = f"{frame.file_path_short or frame.file_path}:{frame.function}"
    key = None
    path = frame.file_path or ""
    if "celery_routines" in path and "site-packages" not in path:
        key = f"celery_routines/{path.split('celery_routines/', 1)[-1]}:{frame.function}"
    else:
        for marker in LIBRARY_MARKERS:
            file_part, _, func = marker.partition(":")
            if path.endswith(file_part) and (not func or frame.function == func):
                key = f"{file_part.split('/')[0]}: {frame.function}"
                break
    # Inclusive time, counted once per stack (recursion must not double it).
    if key is not None and key not in stack:
        totals[key] += frame.time
        stack = (*stack, key)
    for child in frame.children:
        _walk(child, stack, totals)
    del ident


def summarise(profiler: Any, text_path: str, top: int = 25) -> dict[str, Any]:
    session = profiler.last_session
    root = session.root_frame()
    total = root.time if root is not None else 0.0
    totals: dict[str, float] = defaultdict(float)
    if root is not None:
        _walk(root, (), totals)
    Path(text_path).write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return {
        "total_s": total,
        "top": [
            {"frame": k, "seconds": v, "share": (v / total if total else 0.0)} for k, v in ranked
        ],
        "text": text_path,
    }
