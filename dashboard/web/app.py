"""The app factory: config, then the server's parts (dashboard.services), then the web on
top of them: the API and page blueprints (dashboard.web.api, dashboard.web.pages), access
control (dashboard.web.access), gzip for big JSON answers (dashboard.web.compression) and
the Socket.IO namespaces (dashboard.web.sockets)."""

from __future__ import annotations

from typing import Any

from flask import Flask

from dashboard import services as parts
from dashboard.config import DEFAULTS
from dashboard.resources import resource_dir
from dashboard.web import access, compression
from dashboard.web.api import api
from dashboard.web.pages import pages
from dashboard.web.sockets import register_agent_namespace, register_ui_namespace


def create_app(test_config: dict[str, Any] | None = None,
               services: parts.Services | None = None) -> Flask:
    """Build the server. Config: defaults, then ``PGDASH_*`` variables, then ``test_config``.

    ``services`` are the parts it serves from; by default they are built from that config
    (:func:`dashboard.services.build`). The app keeps them as ``app.extensions["pgdash"]``
    (read them with :func:`dashboard.services.current` in a request).
    """
    app = Flask(__name__, static_folder=str(resource_dir("static", "vendor")),
                static_url_path="/static")
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("PGDASH")
    if test_config:
        app.config.update(test_config)
    app.json.sort_keys = False
    if services is None:
        services = parts.build(app.config)
    app.extensions["pgdash"] = services
    socketio = services.socketio
    socketio.init_app(app)
    access.register(app, socketio, app.config["TOKEN"], services.guard)
    compression.register(app)
    app.register_blueprint(pages)
    app.register_blueprint(api)
    register_agent_namespace(socketio, services.ingest, services.guard, services.new_limits)
    register_ui_namespace(socketio, services.ingest, services.pusher)
    return app
