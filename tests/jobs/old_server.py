"""A pgdash server as versions before protocol v2 served it: Werkzeug alone, no /agent/v2.

argv: port, database URL. Used to check that new agents fall back to protocol v1.
"""

import sys

from werkzeug.serving import make_server

from dashboard.web.app import create_app

app = create_app({"DB": sys.argv[2]})
app.extensions["pgdash"].start()  # the live push and diagnosis (dashboard.services)
make_server("127.0.0.1", int(sys.argv[1]), app, threaded=True).serve_forever()
