"""What a run costs, the rule every ceiling counts by.

Every run that went out costs 1 ``fires`` from the moment its row is written,
plus what its ``spend`` JSON recorded when it finished (``{"fires": 1,
"eur": 0.12}``, written by the worker). A ``spend`` value that is not a JSON
object of non-negative numbers (a hand-edited row) costs 1 fire and is
logged, so one bad row cannot stop the beat. Which rows count at all (not
skipped ones, not unsent ones) is the store's query.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable

FIRES = "fires"
"""The unit every run costs one of, whether or not the task reports spend."""

logger = logging.getLogger("celery_routines.ceilings")


def usage(groups: Iterable[tuple[str | None, int]]) -> dict[str, float]:
    """Units spent by runs grouped by their ``spend`` text, ``(spend, count)``
    each; always has ``"fires"`` (0.0 when nothing went out)."""
    parts: dict[str, list[float]] = {FIRES: []}
    for spend, count in groups:
        for unit, amount in run_cost(spend).items():
            parts.setdefault(unit, []).append(amount * count)
    # fsum: ten runs of 0.1 eur add up to 1.0, not 0.9999999999999999.
    return {unit: math.fsum(amounts) for unit, amounts in parts.items()}


def run_cost(spend: str | None) -> dict[str, float]:
    """What one run with this ``spend`` text cost; every run is at least one fire."""
    cost = {FIRES: 1.0}
    if spend is None:
        return cost  # in flight, lost, or finished without a ledger
    try:
        recorded = json.loads(spend)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        logger.warning("run spend %r is not a JSON object; counted as 1 fire", spend)
        return cost
    for unit, amount in recorded.items():
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not math.isfinite(amount)
            or amount < 0
        ):
            logger.warning("run spend %r has a bad amount for %r; ignored", spend, unit)
            continue
        # A run always costs its own fire, whatever the ledger says.
        cost[unit] = max(1.0, float(amount)) if unit == FIRES else float(amount)
    return cost
