"""``celery routines web``: the panel (pages and HTTP API).

Added to the ``routines`` group by :func:`register_web_command`. The panel's
code (Starlette, uvicorn: the ``web`` extra) is imported only when the
command runs, so a missing extra is one line naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from celery_routines.extras import missing_extra

if TYPE_CHECKING:
    from celery_routines.operator.admin import Routines


def register_web_command(
    group: click.Group,
    admin: Callable[[click.Context], Routines],
    errors: Callable[[Callable[..., None]], Callable[..., None]],
) -> None:
    """Add ``web`` to ``group``."""

    @group.command()
    @click.option(
        "--host",
        default="127.0.0.1",
        show_default=True,
        envvar="ROUTINES_WEB_HOST",
        help="Address to bind (or ROUTINES_WEB_HOST).",
    )
    @click.option(
        "--port",
        default=8555,
        show_default=True,
        envvar="ROUTINES_WEB_PORT",
        help="Port to bind (or ROUTINES_WEB_PORT).",
    )
    @click.option("--read-only", is_flag=True, help="Show everything, allow no action.")
    @click.option(
        "--forwarded-allow-ips",
        envvar="ROUTINES_WEB_FORWARDED_ALLOW_IPS",
        help="Proxies (addresses or networks, comma-separated; '*' any) whose "
        "X-Forwarded-Host/-Proto/-For are honoured (default none).",
    )
    @click.option(
        "--hash-password",
        is_flag=True,
        help="Print a password hash for routines_web_auth and exit.",
    )
    @click.pass_context
    @errors
    def web(
        ctx: click.Context,
        host: str,
        port: int,
        read_only: bool,
        forwarded_allow_ips: str | None,
        hash_password: bool,
    ) -> None:
        """Serve the panel (pages and HTTP API) on HOST:PORT; loopback only unless
        routines_web_auth is set. Needs the web extra: pip install 'celery-routines[web]'."""
        try:
            from celery_routines.operator.web.serve import password_hash_prompt, serve
        except ImportError as exc:
            missing = missing_extra(exc, "the panel (celery routines web)")
            if missing is None:
                raise
            raise click.ClickException(str(missing)) from None

        if hash_password:
            click.echo(password_hash_prompt())
            return
        serve(
            admin(ctx),
            host=host,
            port=port,
            read_only=read_only,
            forwarded_allow_ips=forwarded_allow_ips,
        )
