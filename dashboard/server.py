"""A pgdash server on a real port, in a background thread: used by `pgdash serve`, the demo,
benchmarks and tests."""

from __future__ import annotations

import contextlib
import io
import logging
import time
from typing import Any

from dashboard.config import DEFAULTS

log = logging.getLogger("pgdash.server")


class ServerError(Exception):
    """The server cannot start; the message says why and what to do."""


class Server:
    """A pgdash server on a real port, in a background thread."""

    def __init__(self, app, host: str, port: int, ssl_context=None):
        from dashboard.services import Services
        from werkzeug.serving import make_server

        from dashboard.ingest.front import Front

        self.app = app
        self.services: Services = app.extensions["pgdash"]
        said = io.StringIO()
        try:
            # Werkzeug prints why it cannot bind and exits; say it once, here, instead.
            with contextlib.redirect_stderr(said):
                self._server = make_server(host, port, app, threaded=True)
        except (OSError, SystemExit) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else \
                (said.getvalue().strip().splitlines() or ["it cannot bind"])[0]
            raise ServerError(
                f"cannot listen on {host}:{port}: {reason or exc}. "
                "Pick another --port (0 picks a free one).") from None
        self.host = host
        self.port = self._server.server_port
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{self.port}"
        # The front accepts every connection: agents' compact (v2) websockets stay on its
        # event loop, everything else goes to Werkzeug's threads (dashboard.ingest.front). With
        # TLS the front decrypts (dashboard.ingest.tls); Werkzeug only needs to know that its
        # requests came over https (their URL scheme).
        self._server.ssl_context = ssl_context
        self.front = Front(self._server, self.services.ingest,
                           int(app.config["MAX_MESSAGE_BYTES"]), self.services.new_limits,
                           ssl_context)

    def start(self) -> "Server":
        self.services.start()
        self.front.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the connections, store what the writer holds; how long each
        took is logged (a service manager waits for the exit, then kills)."""
        steps = []
        for name, step in (("services", self.services.stop), ("connections", self.front.stop),
                           ("store", self.services.close)):
            start = time.monotonic()
            step()
            steps.append(f"{name} {time.monotonic() - start:.1f} s")
        log.info("pgdash: stopped (%s)", ", ".join(steps))


def make_server(db: str, host: str, port: int, *, tls: tuple[str, str] | None = None,
                **settings: Any) -> Server:
    """A server on ``host:port`` storing into ``db``, not yet started (``.start()``).

    ``settings`` are those of :data:`dashboard.config.DEFAULTS` in lower case (``token``,
    ``hang_after``, ``queue``, ``lease_s``...); None leaves the default (or ``PGDASH_*``).
    ``tls`` is (certificate file, key file) to serve https and wss.
    """
    from dashboard.web.app import create_app
    from dashboard.tls import TLSError, server_context

    # No token unless given: a PGDASH_TOKEN meant for agents must not lock a demo's page.
    config: dict[str, Any] = {"DB": db, "TOKEN": settings.pop("token", None)}
    for name, value in settings.items():
        if name.upper() not in DEFAULTS:
            raise TypeError(f"make_server: unknown setting {name!r}")
        if value is not None:
            config[name.upper()] = value
    try:
        ssl_context = server_context(*tls) if tls else None
        app = create_app(config)
    except (TLSError, ValueError) as exc:
        raise ServerError(str(exc)) from None
    server = Server(app, host, port, ssl_context)
    notifier = server.services.notifier
    if notifier is not None and notifier.base_url is None:
        notifier.base_url = server.url  # links in notifications lead to the job page
    return server
