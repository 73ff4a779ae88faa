"""Access control: with a token configured, nobody without it sees or sends anything.

One place decides who may in, registered once from ``create_app``:

- the HTTP API and ``/metrics``: ``Authorization: Bearer <token>`` (what scripts and
  Prometheus send) or the login cookie; otherwise 401 with a JSON ``{"error": ...}``;
- the pages (``/``, ``/jobs/<id>``): the login cookie; otherwise a redirect to ``/login``;
- the ``/ui`` Socket.IO namespace (browsers): the same cookie or header at connect;
- agents (``/agent``): the token in their auth payload, checked by ``Ingest.connect``.

The cookie holds ``HMAC(token, purpose)``, not the token itself, so a cookie that leaks from a
browser profile does not hand out the token agents use. Every comparison is constant time
(:func:`hmac.compare_digest`), and neither the token nor what a client sent is ever logged or
echoed. Static vendored files stay public: they hold nothing from a job. With no token
configured this module registers nothing and everything stays open (loopback default).

Token guessing is limited per client address (:mod:`dashboard.ingest.guard`): every request that
offers a wrong credential (a bearer header, a cookie, a login form) counts as a failure, and
past ``PGDASH_LOGIN_MAX_FAILURES`` per ``PGDASH_LOGIN_WINDOW_S`` the address gets 429 with a
``Retry-After`` on everything it asks, right token or not, until the window has passed.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any
from urllib.parse import quote

from flask import Flask, jsonify, redirect, render_template, request

from pgdash_agent.wire import AGENT_V2_PATH, UI_NAMESPACE
from dashboard.ingest import guard as login_guard

COOKIE = "pgdash_session"
COOKIE_PURPOSE = b"pgdash browser session v1"
COOKIE_MAX_AGE = 30 * 24 * 3600  # seconds; a login lasts a month, or until /logout
PUBLIC_PREFIXES = ("/static/",)
# Agents authenticate with the token in their first message (Socket.IO's /agent namespace,
# or the compact path's auth frame), not with a header.
PUBLIC_PATHS = ("/login", "/logout", AGENT_V2_PATH)
MACHINE_PREFIXES = ("/api/", "/metrics")  # answered with 401 JSON, never a redirect


def token_matches(token: str, offered: Any) -> bool:
    """Whether ``offered`` is the token, in time that does not depend on where they differ."""
    if not isinstance(offered, str):
        return False
    return hmac.compare_digest(token.encode("utf-8"), offered.encode("utf-8", "surrogatepass"))


class Access:
    """Checks one request or connection against the server's token.

    Args:
        token: the server's ``--token`` / ``PGDASH_TOKEN``; must not be empty.
    """

    def __init__(self, token: str):
        if not token:
            raise ValueError("Access needs a non-empty token (--token / PGDASH_TOKEN)")
        self._token = token
        self._cookie = hmac.new(token.encode("utf-8"), COOKIE_PURPOSE,
                                hashlib.sha256).hexdigest()

    @property
    def cookie_value(self) -> str:
        return self._cookie

    @staticmethod
    def offers_credential(headers: Any, cookies: Any) -> bool:
        """Whether a request tried to authenticate at all (a failure counts as a guess)."""
        return bool(headers.get("Authorization")) or cookies.get(COOKIE) is not None

    def allowed(self, headers: Any, cookies: Any) -> bool:
        """Whether a request (or a Socket.IO connect) carries the token or the login cookie."""
        header = headers.get("Authorization", "") or ""
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and token_matches(self._token, credential.strip()):
            return True
        cookie = cookies.get(COOKIE)
        return isinstance(cookie, str) and hmac.compare_digest(
            self._cookie.encode(), cookie.encode("utf-8", "surrogatepass"))

    def login(self, offered: Any) -> bool:
        return token_matches(self._token, offered)


def _safe_next(target: str | None) -> str:
    """Where to go after login: a path on this server only (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def register(app: Flask, socketio: Any, token: str | None,
             guard: login_guard.LoginGuard | None) -> Access | None:
    """Protect every route and the ``/ui`` namespace of ``app`` with ``token`` (no-op if
    None), counting failed attempts per address in ``guard``. Returns the :class:`Access` in
    use."""
    if not token or guard is None:
        return None
    access = Access(token)

    def too_many(address: str, wait: float, page: bool):
        """429 for an address past its failed attempts; Retry-After in whole seconds."""
        text = guard.message(address, wait)
        if page:
            response = app.make_response((render_template(
                "login.html", next=_safe_next(request.values.get("next")), error=text), 429))
        else:
            response = jsonify(error=text)
            response.status_code = 429
        response.headers["Retry-After"] = str(math.ceil(wait))
        return response

    @app.before_request
    def _require_token():
        path = request.path
        if path.startswith(PUBLIC_PREFIXES) or path in PUBLIC_PATHS:
            return None
        address = guard.address(request.remote_addr, request.headers)
        wait = guard.retry_after(address)
        if wait > 0:  # checked before the credential: a right guess now tells nothing
            return too_many(address, wait, not path.startswith(MACHINE_PREFIXES))
        if access.allowed(request.headers, request.cookies):
            return None
        if access.offers_credential(request.headers, request.cookies):
            guard.failed(address)
        if path.startswith(MACHINE_PREFIXES):
            response = jsonify(error="this pgdash server needs its token: send the header "
                                     "'Authorization: Bearer <token>' (the server's --token "
                                     "or PGDASH_TOKEN), or log in at /login")
            response.status_code = 401
            response.headers["WWW-Authenticate"] = 'Bearer realm="pgdash"'
            return response
        root = request.script_root
        wanted = request.full_path.rstrip("?") if request.query_string else path
        return redirect(f"{root}/login?next={quote(wanted, safe='/')}", code=303)

    @app.route("/login", methods=["GET", "POST"])
    def login():
        target = _safe_next(request.values.get("next"))
        if request.method == "GET":
            return render_template("login.html", next=target, error=None)
        address = guard.address(request.remote_addr, request.headers)
        wait = guard.retry_after(address)
        if wait > 0:
            return too_many(address, wait, page=True)
        if not access.login(request.form.get("token")):
            guard.failed(address)
            # The reason names nothing that was typed: the token is never echoed.
            return render_template("login.html", next=target,
                                   error="That is not this server's token."), 401
        response = redirect(request.script_root + target, code=303)
        response.set_cookie(COOKIE, access.cookie_value, max_age=COOKIE_MAX_AGE,
                            httponly=True, samesite="Strict", secure=request.is_secure,
                            path=(request.script_root or "") + "/")
        return response

    @app.route("/logout", methods=["GET", "POST"])
    def logout():
        response = redirect(request.script_root + "/login", code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="Strict",
                               secure=request.is_secure, path=(request.script_root or "") + "/")
        return response

    @socketio.on("connect", namespace=UI_NAMESPACE)
    def _ui_connect(auth=None):
        from flask_socketio import ConnectionRefusedError

        address = guard.address(request.remote_addr, request.headers)
        wait = guard.retry_after(address)
        if wait > 0:
            raise ConnectionRefusedError(guard.message(address, wait))
        if not access.allowed(request.headers, request.cookies):
            if access.offers_credential(request.headers, request.cookies):
                guard.failed(address)
            raise ConnectionRefusedError("this pgdash server needs its token: log in at "
                                         "/login (the server's --token or PGDASH_TOKEN)")

    return access
