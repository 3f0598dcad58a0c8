"""Reading RedBeat's entries from Redis, without RedBeat.

RedBeat keeps each entry in a hash ``<prefix><name>`` with two JSON fields:
``definition`` (name, task, schedule, args, kwargs, options, enabled) and
``meta`` (``last_run_at``, ``total_run_count``), and indexes the entries in
the sorted set ``<prefix>:schedule``. Its JSON spells datetimes, intervals,
crontabs and rrules as objects with a ``__type__``; they are decoded here as
RedBeat's own decoder reads them. A RedBeat crontab has no zone of its own:
it is read in the app's timezone (``--tz``). Entries RedBeat copied from
``beat_schedule`` (listed in ``<prefix>:statics``) are declared in code,
which our beat imports itself: they are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Any, Literal

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.operator.importers.django_celery_beat import ImportSourceError
from celery_routines.operator.importers.plan import (
    ImportPlan,
    Planned,
    Unmappable,
    behaviour_options,
    behaviour_text,
)
from celery_routines.policy.routine import define
from celery_routines.schedules.interval import whole_seconds
from celery_routines.schedules.parse import crontab_to_cron
from celery_routines.schedules.zones import load_zone

if TYPE_CHECKING:
    from redis import Redis  # an optional extra: imported where it is used

SOURCE = "redbeat"
OWNER = f"import:{SOURCE}"
RRULE_FIELDS = (
    "bysetpos",
    "bymonth",
    "bymonthday",
    "byyearday",
    "byeaster",
    "byweekno",
    "byweekday",
    "byhour",
    "byminute",
    "bysecond",
)


def read(
    url: str,
    *,
    key_prefix: str,
    zone: str,
    catch_up: str = "latest",
    our_defaults: bool = False,
) -> ImportPlan:
    """The import plan of the RedBeat entries at ``url`` under ``key_prefix``
    (RedBeat's ``redbeat_key_prefix``; ``redbeat`` and ``redbeat:`` both work).
    ``our_defaults``: this package's retries and overlap, not RedBeat's."""
    load_zone(zone)
    client = _client(url)
    try:
        prefix = _prefix(client, key_prefix)
        keys = [_text(k) for k in client.zrange(f"{prefix}:schedule", 0, -1)]
        statics = {_text(k) for k in client.smembers(f"{prefix}:statics")}
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "definition", "meta")
        # A key that is not a hash answers WRONGTYPE: that entry is listed,
        # the others are still read.
        stored = pipe.execute(raise_on_error=False)
    except ImportSourceError:
        raise
    except Exception as exc:  # redis-py's errors share no base with ours
        raise ImportSourceError(f"cannot read RedBeat's keys at {_shown(url)}: {exc}") from None
    finally:
        client.close()
    plan = ImportPlan(SOURCE, OWNER, behaviour=behaviour_text(SOURCE, our_defaults))
    behaviour = {"catch_up": catch_up, **behaviour_options(our_defaults)}
    for key, answer in zip(keys, stored, strict=True):
        name = key[len(prefix) :] if key.startswith(prefix) else key
        if isinstance(answer, Exception):
            plan.unmappable.append(Unmappable(name, f"{key} is not a RedBeat hash: {answer}"))
            continue
        definition, meta = answer
        if definition is None:
            plan.unmappable.append(Unmappable(name, f"{key} is listed but has no definition"))
            continue
        try:
            entry = _json_object(definition, "definition")
            name = str(entry.get("name") or name)
            if name in statics:
                plan.left.append(
                    Unmappable(name, "a beat_schedule entry: our beat declares it from the code")
                )
                continue
            last = _json_object(meta, "meta").get("last_run_at") if meta else None
            plan.routines.append(_planned(name, entry, last, zone, behaviour))
        except (ScheduleError, InvalidRoutine) as exc:
            plan.unmappable.append(Unmappable(name, getattr(exc, "problem", None) or str(exc)))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            # A definition RedBeat would not have written: name the value.
            reason = f"its definition does not read ({_problem(exc)}): {_raw(definition)}"
            plan.unmappable.append(Unmappable(name, reason))
    return plan


def _json_object(raw: str | bytes, label: str) -> dict[str, Any]:
    """A RedBeat JSON field decoded, or a ScheduleError naming the raw value."""
    try:
        value = json.loads(raw, object_hook=_decoded)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"its {label} is not JSON ({exc}): {_raw(raw)}") from None
    except UnicodeDecodeError:
        raise ScheduleError(f"its {label} is not UTF-8 text: {_raw(raw)}") from None
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise ScheduleError(f"its {label} does not read ({_problem(exc)}): {_raw(raw)}") from None
    if not isinstance(value, dict):
        raise ScheduleError(f"its {label} must be a JSON object, got {_raw(raw)}")
    return value


def _raw(value: object, limit: int = 120) -> str:
    """A stored value as an error line quotes it: shortened, on one line."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _problem(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r}" if exc.args else "a key is missing"
    return str(exc) or type(exc).__name__


def _client(url: str) -> Redis:
    try:
        import redis
    except ModuleNotFoundError:
        raise ImportSourceError(
            "reading RedBeat needs redis-py: pip install 'celery-routines[redis]'"
        ) from None
    try:
        return redis.Redis.from_url(url)
    except ValueError as exc:
        raise ImportSourceError(f"{url!r} is not a Redis URL: {exc}") from None


def _prefix(client: Redis, given: str) -> str:
    """RedBeat's key prefix, as written (``redbeat:``) or without its colon."""
    for prefix in (given, f"{given}:"):
        if client.exists(f"{prefix}:schedule"):
            return prefix
    raise ImportSourceError(
        f"no RedBeat schedule under the key prefix {given!r} (no key {given}:schedule or "
        f"{given}::schedule): give RedBeat's redbeat_key_prefix with --key-prefix"
    )


def _planned(
    name: str, entry: dict[str, Any], last_run_at: Any, zone: str, behaviour: Mapping[str, Any]
) -> Planned:
    schedule, schedule_zone = _schedule(entry.get("schedule"), zone)
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise ScheduleError(f"its task must be a task name, got {task!r}")
    given: dict[str, Any] = {
        "name": name,
        "args": list(_field(entry, "args", (list, tuple), ())),
        "kwargs": dict(_field(entry, "kwargs", dict, {})),
        "options": dict(_field(entry, "options", dict, {})),
        "enabled": bool(entry.get("enabled", True)),
        **behaviour,
    }
    if schedule_zone is not None:
        given["timezone"] = schedule_zone
    if last_run_at is not None and not isinstance(last_run_at, datetime):
        raise ScheduleError(f"its last_run_at does not read: {last_run_at!r}")
    if last_run_at is not None and last_run_at.tzinfo is None:
        last_run_at = last_run_at.replace(tzinfo=UTC)
    definition = define(task, schedule, **given)
    return Planned(definition, last_run_at.astimezone(UTC) if last_run_at else None)


def _field(entry: dict[str, Any], key: str, kind: type | tuple[type, ...], empty: object) -> Any:
    value = entry.get(key)
    if value is None:
        return empty
    if not isinstance(value, kind):
        raise ScheduleError(f"its {key} must be a JSON {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return "object" if kind is dict else "array"


def _schedule(value: object, zone: str) -> tuple[str | timedelta, str | None]:
    """(the schedule, its zone) of a decoded RedBeat schedule."""
    if not isinstance(value, dict) or "__type__" not in value:
        raise ScheduleError(f"its schedule does not read: {value!r}")
    kind = value["__type__"]
    if kind == "interval":
        every = value.get("every")
        if isinstance(every, bool) or not isinstance(every, int | float):
            raise ScheduleError(f"its interval's every must be a number of seconds, got {every!r}")
        return timedelta(seconds=whole_seconds(every)), None
    if kind == "crontab":
        from celery.schedules import crontab

        fields = {k: value[k] for k in value if k != "__type__"}
        try:
            return crontab_to_cron(crontab(**fields)), zone
        except ScheduleError:
            raise
        except Exception as exc:  # Celery raises ValueError and its own ParseException
            raise ScheduleError(f"its crontab {fields!r} does not read: {exc}") from None
    if kind == "rrule":
        try:
            return _rrule_text(value, zone), zone
        except ScheduleError:
            raise
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            shown = {k: v for k, v in value.items() if k != "__type__"}
            raise ScheduleError(f"its rrule {shown!r} does not read ({_problem(exc)})") from None
    raise ScheduleError(f"its schedule type {kind!r} is unknown")


def _rrule_text(value: dict[str, Any], zone: str) -> str:
    """RFC 5545 text with a local DTSTART in ``zone`` (RedBeat stores the
    start as a timestamp with a fixed offset)."""
    from dateutil.rrule import (
        DAILY,
        HOURLY,
        MINUTELY,
        MONTHLY,
        SECONDLY,
        WEEKLY,
        YEARLY,
        rrule,
        weekday,
    )

    local = load_zone(zone)
    start = value.get("dtstart")
    if start is None:
        raise ScheduleError("its rrule has no dtstart: RedBeat started it when it was read")
    dtstart = _instant(start, value.get("dtstart_tz", 0)).astimezone(local).replace(tzinfo=None)
    until = value.get("until")
    options: dict[str, Any] = {
        k: value[k] for k in RRULE_FIELDS if value.get(k) not in (None, [], ())
    }
    if "byweekday" in options:
        days = options["byweekday"]
        days = days if isinstance(days, list | tuple) else [days]
        options["byweekday"] = [d if isinstance(d, weekday) else weekday(int(d)) for d in days]
    # RedBeat stores dateutil's frequency number, YEARLY (0) to SECONDLY (6).
    frequencies: tuple[Literal[0, 1, 2, 3, 4, 5, 6], ...] = (
        YEARLY,
        MONTHLY,
        WEEKLY,
        DAILY,
        HOURLY,
        MINUTELY,
        SECONDLY,
    )
    freq = int(value["freq"])
    if not 0 <= freq < len(frequencies):
        raise ValueError(f"freq {freq} is not one of dateutil's 0 (yearly) to 6 (secondly)")
    rule = rrule(
        frequencies[freq],
        dtstart=dtstart,
        interval=int(value.get("interval") or 1),
        wkst=value.get("wkst"),
        count=value.get("count"),
        until=None
        if until is None
        else _instant(until, value.get("until_tz", 0)).astimezone(local).replace(tzinfo=None),
        **options,
    )
    return str(rule)


def _instant(timestamp: float, offset_minutes: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=timezone(timedelta(minutes=offset_minutes or 0)))


def _decoded(obj: dict[str, Any]) -> object:
    """RedBeat's ``__type__`` objects that are values, not schedules."""
    kind = obj.get("__type__")
    if kind == "datetime":
        fields = {k: v for k, v in obj.items() if k not in ("__type__", "timezone")}
        zone = obj.get("timezone", "UTC")
        tz: tzinfo = (
            timezone(timedelta(seconds=zone)) if isinstance(zone, int | float) else load_zone(zone)
        )
        return datetime(tzinfo=tz, **fields)
    if kind == "weekday":
        from dateutil.rrule import weekday

        return weekday(int(obj["wkday"]))
    return obj


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "the given URL"
