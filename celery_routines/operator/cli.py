"""``celery -A proj routines ...``: the operator's command.

Registered as a Celery 5 sub-command (entry point group ``celery.commands``),
so it runs with the app Celery loaded from ``-A``. Celery imports every such
entry point in every process the ``celery`` command starts (each worker, each
beat, Celery's own beat too), so this module stays light: the sub-commands
(:mod:`celery_routines.operator.commands`, which bring the store and
SQLAlchemy, about 20 MB) are imported only when ``celery routines`` runs.
``tests/test_imports.py`` pins it.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import click

from celery_routines.operator.app_errors import install_short_app_errors


class _Routines(click.Group):
    """The ``routines`` group, whose sub-commands are imported on first use."""

    def _loaded(self) -> click.Group:
        from celery_routines.operator.commands import routines as loaded

        return loaded

    # Group.__init__ assigns an empty dict: the loaded group's is the one read.
    @property
    def commands(self) -> MutableMapping[str, click.Command]:
        return self._loaded().commands

    @commands.setter
    def commands(self, value: MutableMapping[str, click.Command]) -> None:
        pass

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self._loaded().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._loaded().get_command(ctx, cmd_name)


# The help Celery lists under `celery --help` (the loaded group's docstring).
routines = _Routines(
    name="routines", help="Inspect and operate celery-routines (the database-backed beat)."
)

# A bad routine in the app's code is one ERROR line under every ``celery``
# command: installed when Celery loads this entry point, before it loads -A.
install_short_app_errors()
