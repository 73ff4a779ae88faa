"""Headless Chromium on the live pages (Playwright, the system ``chromium``) and the fake
agents that feed them."""

import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import socketio

from pgdash_agent.wire import AGENT_NAMESPACE, ASK_EVENT, PROTOCOL_VERSION
from tests.helpers.closing import disconnect
from tests.helpers.procs import WAIT_S

try:
    from playwright.sync_api import expect, sync_playwright  # noqa: F401  (re-exported)
except ImportError:  # pragma: no cover - depends on the environment
    expect = sync_playwright = None


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


LIVE_MS = 10_000  # the server pushes within ~1 s; this leaves room for a loaded CI machine


def chromium_path() -> str | None:
    candidate = os.environ.get("PGDASH_CHROMIUM") or shutil.which("chromium") or \
        "/usr/bin/chromium"
    return candidate if Path(candidate).is_file() and os.access(candidate, os.X_OK) else None


@dataclass
class Watched:
    """A page plus everything that went wrong on it: page errors, console errors, dialogs."""

    page: object
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    allowed: list[re.Pattern] = field(default_factory=list)

    def allow_console(self, pattern: str) -> None:
        """Tolerate console errors matching ``pattern`` (text or the resource's URL)."""
        self.allowed.append(re.compile(pattern))

    def on_console(self, msg) -> None:
        if msg.type != "error":
            return
        where = (msg.location or {}).get("url", "")
        text = f"console error: {msg.text} ({where})"
        if not any(p.search(text) for p in self.allowed):
            self.errors.append(text)

    def on_dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def assert_clean(self) -> None:
        assert self.errors == [], "errors on the page:\n" + "\n".join(self.errors)
        assert self.dialogs == [], f"dialogs opened: {self.dialogs}"


def agent_client(url: str, auth: dict) -> socketio.Client:
    """A Socket.IO client connected to the agent namespace."""
    client = socketio.Client(reconnection=False)
    try:
        client.connect(url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       auth=auth, wait_timeout=WAIT_S)
    except socketio.exceptions.ConnectionError:
        disconnect(client)
        raise
    return client


class FakeAgent:
    """One rank's agent, played over a real websocket with the real wire format."""

    def __init__(self, url: str, job: str, rank: int, host: str = "node-a",
                 world_size: int = 2, device: str | None = "cpu"):
        self.job, self.rank, self.host = job, rank, host
        self.seq = 0
        self.client = agent_client(url, {"v": PROTOCOL_VERSION, "session": uuid.uuid4().hex,
                                         "job": job, "rank": rank, "host": host,
                                         "pid": 1000 + rank})
        self.asked: list[dict] = []  # the server's questions (snapshots), for the test to answer
        self.client.on(ASK_EVENT, self.asked.append, namespace=AGENT_NAMESPACE)
        self.send("hello", {"job": job, "rank": rank, "world_size": world_size,
                            "local_rank": rank, "host": host, "pid": 1000 + rank,
                            "backend": "gloo", "device": device})

    def send(self, kind: str, body: dict, *more: tuple[str, dict]) -> None:
        events = []
        for k, b in ((kind, body), *more):
            self.seq += 1
            events.append({"seq": self.seq, "t": time.time(), "kind": k, "body": b})
        ack = self.client.call("batch", {"v": PROTOCOL_VERSION, "events": events},
                               namespace=AGENT_NAMESPACE, timeout=10)
        assert ack.get("ok") and not ack.get("rejected"), ack

    def collectives(self, count: int, op: str = "all_reduce", group: str = "0") -> None:
        now = time.time()
        self.send("coll_stats", {"start": now - 1, "end": now, "rows": [
            {"group": group, "op": op, "count": count, "bytes": 4 * count,
             "sum_us": 50.0 * count, "max_us": 80.0, "hist": [[45, count]]}]})

    def close(self) -> None:
        disconnect(self.client)


def rank_row(page, rank: int):
    return page.locator("#ranks-body tr").filter(
        has=page.locator("td:first-child", has_text=re.compile(rf"^{rank}$")))


# Columns of the ranks table (job.html).
HOST, DEVICE, STATUS, COLLECTIVES = 1, 4, 5, 7
