"""Big JSON answers gzipped for the browsers and scripts that accept it.

A moment of a 1,024-rank job (``state?at=``) is ~2 MB of JSON and ~160 KB gzipped: over a
VPN to a cluster's head node the bytes, not the server, set how fast the replay slider moves.
zlib level 1 takes ~10 ms for such an answer. Streamed answers (exports) and small ones go
as they are.
"""

from __future__ import annotations

import gzip

from flask import Flask, Response, request

MIN_BYTES = 16 * 1024  # smaller answers gain less than the header and the time cost
LEVEL = 1


def register(app: Flask) -> None:
    app.after_request(gzipped)


def gzipped(response: Response) -> Response:
    """``response`` gzipped, when it is a whole JSON answer of MIN_BYTES or more and the
    client says it accepts gzip."""
    if (response.status_code != 200 or response.mimetype != "application/json"
            or response.direct_passthrough or response.is_streamed
            or "Content-Encoding" in response.headers
            or request.accept_encodings["gzip"] <= 0):  # absent, or q=0
        return response
    data = response.get_data()
    if len(data) < MIN_BYTES:
        return response
    response.set_data(gzip.compress(data, compresslevel=LEVEL, mtime=0))
    response.headers["Content-Encoding"] = "gzip"
    response.vary.add("Accept-Encoding")
    return response
