"""pgdash's server as a WSGI app for gunicorn, for bench.webserver's comparison only.

Importing it builds the server ``pgdash serve`` builds (``dashboard.server.make_server``:
store, fold, diagnosis, live push, Socket.IO) on ``PGDASH_BENCH_DB`` and starts it, with its
asyncio front for agents of protocol v2 on ``PGDASH_BENCH_V2_PORT``: gunicorn owns the HTTP
port, so the agents get a second port. ``app`` is the same Flask app Werkzeug serves.
gunicorn imports it in its worker, after the fork (and, with ``-k gevent``, after gevent has
patched threads, sockets and locks)::

    PGDASH_BENCH_DB=sqlite:///x.db PGDASH_BENCH_V2_PORT=9001 \\
        gunicorn -w 1 -k gthread --threads 100 -b 127.0.0.1:9000 bench.webserver_app:app
"""

from __future__ import annotations

import os
import sys

from dashboard.server import make_server

if "gevent" in sys.modules:  # -k gevent: gevent's Queue has no ``mutex``, which the writer
    from gevent import monkey  # reads; the stdlib's class on gevent's patched locks has

    if monkey.is_module_patched("queue"):
        import queue

        queue.Queue = monkey.get_original("queue", "Queue")

server = make_server(os.environ["PGDASH_BENCH_DB"], "127.0.0.1",
                     int(os.environ["PGDASH_BENCH_V2_PORT"])).start()
app = server.app
