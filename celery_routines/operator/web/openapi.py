"""The HTTP API's OpenAPI document (hand-written; served at /api/openapi.json)."""

from __future__ import annotations

from typing import Any

from celery_routines.operator.routine_form import CLEARS, FIELDS, FormField

ERROR = {
    "description": "An error in the CLI's words",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"error": {"type": "string"}},
                "required": ["error"],
            }
        }
    },
}
OK = {"description": "The admin API's answer as JSON", "content": {"application/json": {}}}
NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, kind: str = "string", about: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": kind}, "description": about}


SINCE = _query("since", about="written since: 2026-11-30, 2026-11-30T08:00Z, 2h, 7d (UTC)")
UNTIL = _query("until", about="written until (same forms as since)")
STATE = _query("state", about="run state; repeatable")
LIMIT = _query("limit", "integer", "at most this many, newest first")


def _get(summary: str, *parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "parameters": list(parameters),
            "responses": {"200": OK, "400": ERROR, "404": ERROR},
        }
    }


def _post(summary: str, body: dict[str, Any] | None, *parameters: dict[str, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "parameters": list(parameters),
        "security": [{"bearer": []}],
        "responses": {"200": OK, "400": ERROR, "403": ERROR, "404": ERROR, "409": ERROR},
    }
    if body:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"type": "object", "properties": body}}},
        }
    return {"post": operation}


def _field_schema(field: FormField) -> dict[str, Any]:
    kinds: dict[str, Any] = {
        "lines": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "json": {"type": "array" if field.name == "args" else "object"},
        "whole": {"type": "integer"},
        "number": {"type": "number"},
        "duration": {"oneOf": [{"type": "number"}, {"type": "string"}]},
    }
    schema = kinds.get(field.kind, {"type": "string"})
    if field.choices:
        schema = {"type": "string", "enum": [c for c in field.choices if c]}
    return {**schema, "description": field.help}


# The fields the form declares, named as GET /api/routines/{name} answers.
DEFINITION = {field.name: _field_schema(field) for field in FIELDS}
INVALID = {
    "description": "Bad fields, each named, in the CLI's words",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {"type": "string"},
                    "fields": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                "required": ["error", "fields"],
            }
        }
    },
}


def _write(summary: str, created: str, required: list[str], *parameters: Any) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": list(parameters),
        "security": [{"bearer": []}],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"type": "object", "properties": DEFINITION, "required": required}
                }
            },
        },
        "responses": {created: OK, "403": ERROR, "404": ERROR, "409": ERROR, "422": INVALID},
    }


FORCE = {"force": {"type": "boolean", "description": "send over an open run or a spent ceiling"}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "celery-routines panel API", "version": "1"},
    "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "basic": {"type": "http", "scheme": "basic"},
        }
    },
    "paths": {
        "/api/routines": {
            **_get(
                "A page of routines (each with its name, summary and newest 30 runs)",
                _query("state", about="active, paused, suspended, invalid or disabled"),
                _query("name", about="part of the name"),
                _query("page", "integer"),
                _query("per_page", "integer", "1 to 500 (50)"),
                _query(
                    "sort", about="failure_rate or lateness: the worst of the last 7 days first"
                ),
            ),
            "post": _write(
                "Create a routine (as `celery routines add`): 201, or 422 naming each bad field",
                "201",
                ["name", "task"],
            ),
        },
        "/api/routines/{name}": {
            **_get(
                "One routine: definition, owner, next windows, ceilings",
                NAME,
                _query("windows", "integer", "how many next windows (10)"),
            ),
            "patch": _write(
                "Change the fields given (as `celery routines edit`); 409 for a routine "
                f"declared in code; null clears {', '.join(CLEARS)}",
                "200",
                [],
                NAME,
            ),
        },
        "/api/routines/validate": _post(
            "Check a form's fields as typed: per-field errors and the next 10 windows "
            "(in the zone and UTC, DST nights marked)",
            {
                "fields": {"type": "object", "additionalProperties": {"type": "string"}},
                "editing": {"type": "string", "description": "the routine being edited"},
            },
        ),
        "/api/routines/{name}/runs": _get("Runs of one routine", NAME, STATE, SINCE, UNTIL, LIMIT),
        "/api/routines/{name}/stats": _get(
            "One routine's record: counts by state, success rate, duration and lateness "
            "p50/p95, retries, skips by reason, catch-up drops, a 30-day strip",
            NAME,
            _query("days", "integer", "the period, 1 to 90 days (7); the strip is always 30"),
        ),
        "/api/skips": _get("Every decision not to fire, newest first", SINCE, LIMIT),
        "/api/runs": _get("Runs across routines", _query("routine"), STATE, SINCE, UNTIL, LIMIT),
        "/api/beats": _get(
            "Every beat that ticked in the last hour: host, pid, last tick and seconds since "
            "(database clock), tick p50/p99 (ms), claims held, clock skew (s), publishing "
            "processes, version; stale: silent longer than stale_after_seconds"
        ),
        "/api/routines/{name}/pause": _post(
            "Pause",
            {"reason": {"type": "string", "description": "why (at most 200 characters)"}},
            NAME,
        ),
        "/api/routines/bulk/{action}": _post(
            "One action on the routines named or matching a filter (at most 1000)",
            {
                "names": {"type": "array", "items": {"type": "string"}},
                "filter": {
                    "type": "object",
                    "properties": {"state": {"type": "string"}, "name": {"type": "string"}},
                },
                "reason": {"type": "string", "description": "required for a pause"},
            },
            {
                "name": "action",
                "in": "path",
                "required": True,
                "schema": {"enum": ["pause", "resume", "enable", "disable", "trigger"]},
            },
        ),
        "/api/routines/{name}/resume": _post(
            "Resume",
            {"catch_up": {"type": "boolean", "description": "replay paused windows by policy"}},
            NAME,
        ),
        "/api/routines/{name}/enable": _post("Enable a disabled SQL/CLI routine", None, NAME),
        "/api/routines/{name}/disable": _post("Disable a SQL/CLI routine", None, NAME),
        "/api/routines/{name}/delete": _post(
            "Delete a retired or SQL/CLI routine and its runs", None, NAME
        ),
        "/api/routines/{name}/trigger": _post("Send now under a manual key", FORCE, NAME),
        "/api/routines/{name}/backfill": _post(
            "Send the windows of a past range (preview: count only)",
            {
                "from": {"type": "string"},
                "to": {"type": "string"},
                "max": {"type": "integer"},
                "preview": {"type": "boolean"},
                "overlap": {"type": "string", "enum": ["skip", "queue", "replace", "overlap"]},
                **FORCE,
            },
            NAME,
        ),
        "/api/runs/{run_id}/replay": _post(
            "Send a failed, skipped or lost run again",
            FORCE,
            {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}},
        ),
    },
}
