"""TLS for ``pgdash serve --tls-cert FILE --tls-key FILE``: the server's SSL context.

Werkzeug's server takes an :class:`ssl.SSLContext`; building it here first turns every way the
files can be wrong (missing, unreadable, not PEM, key not matching the certificate) into one
message that names the file and the flag, before anything listens.
"""

from __future__ import annotations

import ssl


class TLSError(ValueError):
    """The certificate or key cannot be used; the text names the file and the flag."""


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """An SSL context serving ``cert_file`` (PEM, chain allowed) with ``key_file``.

    Raises:
        TLSError: a file is unreadable, not PEM, or the key does not match the certificate.
    """
    for flag, path in (("--tls-cert (PGDASH_TLS_CERT)", cert_file),
                       ("--tls-key (PGDASH_TLS_KEY)", key_file)):
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as exc:
            raise TLSError(f"cannot read {flag} file {path}: {exc.strerror or exc}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise TLSError(
            f"cannot use --tls-cert {cert_file} with --tls-key {key_file}: {exc.reason or exc}; "
            "both must be PEM files and the key must belong to the certificate") from None
    return context
