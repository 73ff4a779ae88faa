"""Webhook notifications: each new, escalated and resolved incident POSTed as JSON (--notify).

The payload is understood by Slack-compatible incoming webhooks (its ``text`` field) and by
anything that reads JSON (the incident itself, the job, the event). Sending happens on its
own thread from a bounded queue: ingest and diagnosis only enqueue, never wait on the
network; a full queue drops the notification and counts it. Each POST has a timeout and is
retried with exponential backoff; a notification that still fails is counted and logged.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable
from urllib.parse import urlsplit

log = logging.getLogger("pgdash.notify")

WORDS = {"new": "new", "escalated": "now critical", "resolved": "resolved"}


def payload(event: str, job: dict[str, Any], incident: dict[str, Any],
            base_url: str | None = None) -> dict[str, Any]:
    """What is POSTed for one incident event (``new``, ``escalated`` or ``resolved``)."""
    name = job.get("name") or f"job {job.get('id')}"
    link = f"{base_url.rstrip('/')}/jobs/{job.get('id')}" if base_url else None
    lines = [f"[pgdash] {incident['severity'].upper()} incident {WORDS.get(event, event)} in "
             f"{name}: {incident['summary']}"]
    if event != "resolved":
        lines.append(f"Next: {incident['hint']}")
    if link:
        lines.append(link)
    return {"text": "\n".join(lines), "event": event,
            "job": {"id": job.get("id"), "name": job.get("name"), "status": job.get("status")},
            "incident": {k: v for k, v in incident.items() if k != "chain"},
            "url": link}


def check_url(url: str) -> str:
    """The webhook URL, or ValueError naming the knob and what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--notify / PGDASH_NOTIFY must be an http(s) URL such as "
                         f"https://hooks.slack.com/services/..., got {url!r:.80}")
    return url


class Notifier:
    """POSTs incident events to one URL from a background thread.

    Args:
        url: the webhook (``--notify``, ``PGDASH_NOTIFY``).
        base_url: the server's own address, for a link to the job page (may be None).
        timeout: seconds one POST may take (``PGDASH_NOTIFY_TIMEOUT``).
        retries: further attempts after a failed POST (``PGDASH_NOTIFY_RETRIES``).
        backoff: seconds before the first retry, doubled each time.
        max_queue: notifications waiting to be sent; more are dropped and counted
            (``PGDASH_NOTIFY_QUEUE``).
        post: ``post(url, body bytes, timeout)`` (injected for tests; default urllib).
    """

    def __init__(self, url: str, base_url: str | None = None, timeout: float = 5.0,
                 retries: int = 3, backoff: float = 0.5, max_queue: int = 256,
                 post: Callable[[str, bytes, float], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.url = check_url(url)
        self.base_url = base_url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._post = post or _urllib_post
        self._sleep = sleep
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self.counters: collections.Counter[str] = collections.Counter()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> "Notifier":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgdash-notify",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def __call__(self, event: str, job: dict[str, Any], incident: dict[str, Any]) -> bool:
        """Queue one notification; False (and counted) if the queue is full."""
        try:
            self._queue.put_nowait(payload(event, job, incident, self.base_url))
        except queue.Full:
            self._count("dropped")
            return False
        self._count("queued")
        return True

    def _count(self, what: str) -> None:
        with self._lock:
            self.counters[what] += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                body = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            self._send(body)

    def _send(self, body: dict[str, Any]) -> bool:
        data = json.dumps(body).encode()
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                self._post(self.url, data, self.timeout)
                self._count("sent")
                return True
            except Exception as exc:  # any failure of one POST is retried the same way
                last = exc
                if attempt < self.retries and not self._stop.is_set():
                    self._count("retried")
                    self._sleep(delay)
                    delay *= 2
        self._count("failed")
        log.warning("pgdash: could not notify %s after %d attempts (%s); the incident is "
                    "still on the page and in GET /api/jobs/<id>/incidents", self.url,
                    self.retries + 1, last)
        return False


def _urllib_post(url: str, data: bytes, timeout: float) -> None:
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "User-Agent": "pgdash-notify"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the connection open otherwise
        raise RuntimeError(f"the webhook answered HTTP {exc.code} {exc.reason}") from None
