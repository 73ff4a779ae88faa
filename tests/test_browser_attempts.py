"""The job page of a restarted job in a real browser: its attempts listed, and the earlier
attempt's findings marked with their attempt (see test_browser.py for the set-up)."""

from __future__ import annotations

import time
import uuid

import socketio

from agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION
from test_browser import LIVE_MS, browser, job_id, watched  # noqa: F401 (fixtures)

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - test_browser's fixture skips then
    expect = None


class Rank:
    """One rank's agent of one attempt, over a real websocket in the real wire format."""

    def __init__(self, url: str, job: str, rank: int, attempt: int):
        self.seq = 0
        self.client = socketio.Client(reconnection=False)
        self.client.connect(url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                            auth={"v": PROTOCOL_VERSION, "session": uuid.uuid4().hex,
                                  "job": job, "rank": rank, "host": "node-a",
                                  "pid": 100 * attempt + rank, "attempt": attempt})
        self.send("hello", {"job": job, "rank": rank, "world_size": 2, "local_rank": rank,
                            "host": "node-a", "pid": 100 * attempt + rank,
                            "backend": "gloo", "device": "cpu", "attempt": attempt})

    def send(self, kind: str, body: dict) -> None:
        self.seq += 1
        ack = self.client.call("batch", {"v": PROTOCOL_VERSION, "events": [
            {"seq": self.seq, "t": time.time(), "kind": kind, "body": body}]},
            namespace=AGENT_NAMESPACE, timeout=10)
        assert ack.get("ok") and not ack.get("rejected"), ack


def test_job_page_lists_the_attempts_of_a_restarted_job(server, watched):  # noqa: F811
    page = watched.page
    first = [Rank(server.url, "restarted", r, 0) for r in (0, 1)]
    first[1].send("error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": "<b>boom</b> in attempt 0"})
    first[1].send("exit", {"clean": False, "reason": "uncaught exception"})
    first[0].send("exit", {"clean": False, "reason": "SIGTERM from torchrun"})
    for rank in first:
        rank.client.disconnect()
    second = [Rank(server.url, "restarted", r, 1) for r in (0, 1)]
    try:
        jid = job_id(server, "restarted")
        page.goto(f"{server.url}/jobs/{jid}")
        items = page.locator("#job-attempts li.attempt")
        expect(items).to_have_count(2, timeout=LIVE_MS)
        expect(items.nth(0)).to_contain_text("attempt 0")
        expect(items.nth(0).locator(".badge")).to_have_text("failed")
        expect(items.nth(0)).to_contain_text("failed or lost: ranks 0")
        expect(items.nth(1)).to_contain_text("attempt 1")
        expect(items.nth(1)).to_contain_text("2 ranks")
        expect(items.nth(1)).not_to_contain_text("failed or lost")
        finding = page.locator("[data-finding=\"rank_failed:-:r1\"]")
        expect(finding).to_contain_text("attempt 0")
        expect(finding).to_contain_text("resolved", timeout=LIVE_MS)
        # the attempt's error text is data: shown as typed, never parsed as HTML
        expect(page.locator("#errors")).to_contain_text("<b>boom</b> in attempt 0")
        assert page.locator("#errors b").count() == 0

        for rank in second:  # the second attempt ends well: the list follows live
            rank.send("exit", {"clean": True, "reason": "exit"})
        expect(items.nth(1)).to_contain_text("finished", timeout=LIVE_MS)
    finally:
        for rank in second:
            rank.client.disconnect()
