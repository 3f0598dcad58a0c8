"""One action on many routines (issue 33): pause, resume, enable, disable or
trigger the routines named, or every routine a filter matches.

A collaborator of :class:`celery_routines.operator.admin.Routines`: each
routine goes through the admin API's own one-routine operation, so a bulk
pause is audited like a pause, once per routine, with the person. The
targets are settled first (an unknown name or a filter matching too many
refuses the whole action, naming the value); then one routine refused (a
routine declared in code cannot be disabled here) does not stop the rest,
and the answer says which and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from celery_routines.declare import process_user
from celery_routines.errors import InvalidRoutine, RoutinesError, UnknownRoutine
from celery_routines.operator.lifecycle_views import ChangeResult
from celery_routines.operator.views import PauseResult, SendResult
from celery_routines.sending.dispatch import SEND_FAILED, SENT
from celery_routines.store import Store
from celery_routines.store.panel_queries import ROUTINE_STATES

BULK_ACTIONS = ("pause", "resume", "enable", "disable", "trigger")
# The most routines one bulk action takes: a filter matching more is refused.
MAX_BULK = 1000
# A pause's reason is a short text (shown in the list's state column).
MAX_REASON = 200


@dataclass(frozen=True)
class BulkItem:
    routine: str
    changed: bool
    """False when it already was in the asked state, or was refused."""
    outcome: str
    """``paused``, ``already paused``, ``sent``, ``refused``, ..."""
    error: str | None = None
    """Why this routine was refused (the others went ahead)."""


@dataclass(frozen=True)
class BulkResult:
    action: str
    routines: list[BulkItem] = field(default_factory=list)
    reason: str | None = None
    by: str | None = None

    @property
    def count(self) -> int:
        return len(self.routines)

    @property
    def changed(self) -> int:
        return sum(1 for item in self.routines if item.changed)

    @property
    def refused(self) -> int:
        return sum(1 for item in self.routines if item.error is not None)


def check_action(action: str) -> None:
    if action not in BULK_ACTIONS:
        raise LookupError(f"no bulk action named {action!r}; use one of {', '.join(BULK_ACTIONS)}")


def pause_reason(reason: object, *, required: bool) -> str | None:
    """The reason as stored (stripped), or ``ValueError`` naming the value."""
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        if required:
            raise ValueError(
                "a pause needs a reason: a short text saying why (shown wherever the "
                "routine shows as paused)"
            )
        return None
    if not isinstance(reason, str):
        raise ValueError(f"reason must be a text, got {reason!r}")
    text = " ".join(reason.split())
    if len(text) > MAX_REASON:
        raise ValueError(f"reason is {len(text)} characters long; at most {MAX_REASON}: {text!r}")
    return text


class OneRoutineOperations(Protocol):
    """What a bulk action asks of the admin API (:class:`~celery_routines.
    operator.admin.Routines`, which holds a :class:`BulkActions`): its store
    and clock, and the one-routine operations it repeats."""

    store: Store

    def clock(self) -> datetime: ...

    def pause(
        self, name: str, *, reason: str | None = None, by: str | None = None
    ) -> PauseResult: ...

    def resume(
        self, name: str, *, catch_up: bool = False, by: str | None = None
    ) -> PauseResult: ...

    def enable(self, name: str, *, by: str | None = None) -> ChangeResult: ...

    def disable(self, name: str, *, by: str | None = None) -> ChangeResult: ...

    def trigger(self, name: str, *, force: bool = False, by: str | None = None) -> SendResult: ...


class BulkActions:
    """Settles the targets of a bulk action and carries it out."""

    def __init__(self, admin: OneRoutineOperations) -> None:
        self.admin = admin

    def targets(
        self,
        names: Sequence[str] | None = None,
        *,
        state: str | None = None,
        name: str | None = None,
        use_filter: bool = False,
    ) -> list[str]:
        """The routine names an action takes: ``names`` (each must be stored),
        or with ``use_filter`` every routine matching ``state`` and ``name``
        (a part of the name), as the panel's list filters them."""
        if use_filter:
            if names:
                raise ValueError("give either names or a filter, not both")
            return self._matching(state, name)
        if not names:
            raise ValueError("name the routines (names: [...]) or give a filter")
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"names must be a list of routine names, got {names!r}")
        unique = list(dict.fromkeys(names))
        if len(unique) > MAX_BULK:
            raise ValueError(
                f"{len(unique)} routines named; a bulk action takes at most {MAX_BULK}"
            )
        unknown = [n for n in unique if self.admin.store.routines.by_name(n) is None]
        if len(unknown) == 1:
            raise UnknownRoutine(unknown[0])
        if unknown:
            raise LookupError(f"no routines named {', '.join(map(repr, unknown))} are stored")
        return unique

    def _matching(self, state: str | None, name: str | None) -> list[str]:
        if state and state not in ROUTINE_STATES:
            raise ValueError(f"state {state!r} is unknown; use one of {', '.join(ROUTINE_STATES)}")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"the filter's name must be a text, got {name!r}")
        found = self.admin.store.panel.routine_page(
            now=self.admin.clock(), state=state or None, name=name or None, limit=MAX_BULK + 1
        )
        if found.total > MAX_BULK:
            raise ValueError(
                f"the filter matches {found.total} routines; a bulk action takes at most "
                f"{MAX_BULK}: narrow the filter"
            )
        return [record.name for record in found.records]

    def check(self, action: str, reason: object) -> str | None:
        """The action is one of :data:`BULK_ACTIONS`, a pause has its reason
        (returned as stored), and no other action has one."""
        check_action(action)
        if action == "pause":
            return pause_reason(reason, required=True)
        if reason is not None and reason != "":
            raise ValueError(f"a reason is only given for a pause, not for {action}")
        return None

    def run(
        self,
        action: str,
        names: Sequence[str] | None = None,
        *,
        state: str | None = None,
        name: str | None = None,
        use_filter: bool = False,
        reason: object = None,
        by: str | None = None,
    ) -> BulkResult:
        """``action`` on the routines named, or on those the filter matches
        (see :meth:`targets`), each through the admin API's own operation."""
        text = self.check(action, reason)
        found = self.targets(names, state=state, name=name, use_filter=use_filter)
        by = by or process_user()
        items = []
        for routine in found:
            try:
                items.append(self._one(action, routine, text, by))
            except (RoutinesError, ValueError, LookupError) as exc:
                problem = exc.problem if isinstance(exc, InvalidRoutine) else str(exc)
                items.append(BulkItem(routine, False, "refused", problem))
        return BulkResult(action, items, text, by)

    def _one(self, action: str, name: str, reason: str | None, by: str) -> BulkItem:
        admin = self.admin
        if action == "pause":
            paused = admin.pause(name, reason=reason, by=by)
            return BulkItem(name, paused.changed, "paused" if paused.changed else "already paused")
        if action == "resume":
            resumed = admin.resume(name, by=by)
            return BulkItem(
                name, resumed.changed, "resumed" if resumed.changed else "already running"
            )
        if action in ("enable", "disable"):
            change = admin.enable(name, by=by) if action == "enable" else admin.disable(name, by=by)
            done = f"{action}d"
            return BulkItem(name, change.changed, done if change.changed else f"already {done}")
        sent = admin.trigger(name, by=by)
        error = sent.error if sent.outcome == SEND_FAILED else None
        return BulkItem(name, sent.outcome == SENT, sent.outcome, error)
