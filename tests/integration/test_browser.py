"""The pages in a real browser: Playwright driving Debian's Chromium against `pgdash serve`.

Every test runs a real server subprocess (the ``server`` fixture) and plays agents over real
websockets, then checks what a person would see: live updates without a reload, the jobs
list and its filter, data shown as text and never as HTML, a page that works with no network
beyond the server, and a clear not-found state. Any uncaught page error, console error or
dialog fails the test.

The browser is ``chromium`` from the system (``apt-get install chromium``; ``tools/test``
installs it when run as root). ``playwright install`` is never needed: Playwright only drives
the installed binary. Without the binary, or without the ``playwright`` package, these tests
are skipped with a reason saying what to install.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

from pgdash_agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION
from tests.helpers.closing import disconnect
from tests.helpers.procs import (ServerProcess, job_by_name, launch_job, metric, wait_for,
                                 wait_job)
from tests.helpers.browser import (CHROMIUM_ARGS, COLLECTIVES, DEVICE, HOST, LIVE_MS, STATUS,
                                   FakeAgent, Watched, agent_client, chromium_path, rank_row)

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None


# ------------------------------------------------------------------------------ fixtures --

@pytest.fixture
def watched(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    w = Watched(page)
    page.on("pageerror", lambda exc: w.errors.append(f"page error: {exc}"))
    page.on("console", w.on_console)
    page.on("dialog", w.on_dialog)
    try:
        yield w
        w.assert_clean()
    finally:
        context.close()


# --------------------------------------------------------------------------- fake agent --


@pytest.fixture
def agents(server):
    """Make FakeAgents against ``server``; all are disconnected afterwards."""
    made: list[FakeAgent] = []

    def make(job: str, rank: int = 0, **kw) -> FakeAgent:
        made.append(FakeAgent(server.url, job, rank, **kw))
        return made[-1]

    yield make
    # A websocket close waits up to ~3 s for the server's close frame: close them together.
    closers = [threading.Thread(target=agent.close, daemon=True) for agent in made]
    for t in closers:
        t.start()
    for t in closers:
        t.join(timeout=15)


def close_all(agents) -> None:
    """Close fake agents in parallel (each close waits for its socket to shut)."""
    closers = [threading.Thread(target=a.close, daemon=True) for a in agents]
    for t in closers:
        t.start()
    for t in closers:
        t.join(timeout=15)


def job_id(server, name: str) -> int:
    return wait_for(lambda: job_by_name(server, name), 60, f"job {name!r}")["id"]


# -------------------------------------------------------------------------------- tests --

def test_job_page_updates_live_without_reload(server, agents, watched):
    page = watched.page
    r0 = agents("live", 0, host="node-a")
    r0.send("group", {"name": "0", "desc": "world", "backend": "gloo", "ranks": [0, 1]})
    r0.collectives(3)
    jid = job_id(server, "live")

    page.goto(f"{server.url}/jobs/{jid}")
    expect(page.locator("#live-text")).to_have_text("Live")
    expect(page.locator("#job-name")).to_have_text("live")
    expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text("3")
    expect(rank_row(page, 0).locator(".rank-state")).to_have_text("running")
    expect(page.locator("#groups-body")).to_contain_text("world")
    page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

    r0.collectives(4)
    expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text("7", timeout=LIVE_MS)
    expect(page.locator("#coll-body tr").first).to_contain_text("all_reduce")
    # Latency per op over time: the op's p50 and p99 lines, named in the chart's legend.
    expect(page.locator("#latency-chart")).to_contain_text("world all_reduce p99")
    expect(page.locator("#bytes-chart")).to_contain_text("world")
    # The heat map's newest second for rank 0 (cells travel as characters: decoded here).
    heat = page.locator("#heatmap canvas")
    expect(heat).to_have_count(1)
    size = heat.bounding_box()
    heat.hover(position={"x": size["width"] - 8, "y": 5})
    expect(page.locator("#heatmap .chart-tip")).to_contain_text(
        re.compile(r"\d+% of the second inside collectives"))

    r1 = agents("live", 1, host="node-b")
    expect(page.locator("#ranks-body tr")).to_have_count(2, timeout=LIVE_MS)
    expect(rank_row(page, 1).locator("td").nth(HOST)).to_have_text("node-b")
    expect(page.locator("#ranks-summary")).to_have_text("2 ranks on 2 hosts · 2 running")

    expect(page.locator("#job-dropped")).to_have_count(0)  # nothing dropped: nothing said
    r1.send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 4,
                                      "inflight_op": "all_reduce",
                                      "inflight_since": time.time()}],
                          "dropped": {"coll_stats": 7, "heartbeat": 3,
                                      "flight_recorder": 500}})
    expect(page.locator("#progress")).to_contain_text("r1", timeout=LIVE_MS)
    # What an agent had to drop (its buffer was full) is shown, by kind on hover.
    expect(page.locator("#job-dropped")).to_have_text("10 events", timeout=LIVE_MS)
    expect(page.locator("#job-dropped")).to_have_attribute("title", "coll_stats: 7, heartbeat: 3")
    # Collectives it could not time are latency samples, not events: said apart.
    expect(page.locator("#job-untimed")).to_have_text("500 collectives")
    expect(rank_row(page, 1).locator("td").nth(9)).to_contain_text("all_reduce")

    r0.send("exit", {"clean": True, "exitcode": 0})
    expect(rank_row(page, 0).locator(".rank-state")).to_have_text("exited", timeout=LIVE_MS)
    r1.send("exit", {"clean": False, "reason": "SIGTERM", "exitcode": -15})
    expect(rank_row(page, 1).locator(".rank-state")).to_have_text("failed", timeout=LIVE_MS)
    expect(page.locator("#job-status")).to_have_text("failed", timeout=LIVE_MS)
    expect(page.locator("#job-meta")).to_contain_text("Ended")

    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    watched.assert_clean()


def test_jobs_list_updates_live_and_filters_by_name(server, agents, watched):
    page = watched.page
    agents("alpha-train")
    job_id(server, "alpha-train")

    page.goto(server.url + "/")
    rows = page.locator("#jobs-body tr")
    expect(page.locator("#live-text")).to_have_text("Live")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("alpha-train")
    expect(page.locator("#jobs-count")).to_have_text("1 job")
    page.evaluate("window.__sameDocument = true")

    agents("beta-eval")
    expect(rows).to_have_count(2, timeout=LIVE_MS)
    expect(rows.first).to_contain_text("beta-eval")  # newest first
    expect(page.locator("#jobs-count")).to_have_text("2 jobs")

    search = page.locator("#jobs-search")
    search.fill("BETA")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("beta-eval")
    expect(page.locator("#jobs-count")).to_have_text("1 of 2 jobs")
    assert page.evaluate("location.search") == "?q=BETA"

    agents("beta-2")  # a new job that matches the filter shows up, filtered, live
    expect(rows).to_have_count(2, timeout=LIVE_MS)
    expect(page.locator("#jobs-count")).to_have_text("2 of 3 jobs")
    expect(page.locator("#jobs-body")).not_to_contain_text("alpha-train")

    search.fill("no-such-job")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_text("No jobs match “no-such-job”")
    search.press("Escape")
    expect(rows).to_have_count(3)
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"

    page.get_by_role("link", name="alpha-train").click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+$"))
    expect(page.locator("#job-name")).to_have_text("alpha-train")
    watched.assert_clean()


def test_jobs_list_tells_apart_launches_that_share_a_name(server, agents, watched):
    """Two launches under one name: the list says which is run 2, and each row and the job
    page's header say how it was launched (the command is data: text, never markup)."""
    page = watched.page
    command = "train.py --note " + HOSTILE_HOST
    launch = {"command": command, "launcher": "torchrun", "launcher_id": "6fd5bf1d"}
    first = agents("same-name", 0)
    first.send("hello", {"job": "same-name", "rank": 0, "world_size": 2, "host": "node-a",
                         "pid": 1000, "backend": "gloo", "attempt": 1, **launch})
    first_id = job_id(server, "same-name")
    second = agents("same-name", 0)  # rank 0 again: a new launch reusing the name
    second.send("hello", {"job": "same-name", "rank": 0, "world_size": 2, "host": "node-a",
                          "pid": 1000, "backend": "gloo", **launch, "launcher_id": "0a1b2c3d"})
    wait_for(lambda: len([j for j in server.api("/api/jobs")["jobs"]
                          if j["name"] == "same-name" and j["launcher"]]) == 2, 10, "2 jobs")

    page.goto(server.url + "/")
    rows = page.locator("#jobs-body tr")
    expect(rows).to_have_count(2)
    newest, oldest = rows.nth(0), rows.nth(1)
    expect(newest.locator(".tag-run")).to_have_text("run 2")
    expect(oldest.locator(".tag-run")).to_have_count(0)
    expect(newest.locator(".launch-cmd")).to_have_text(command)
    expect(newest.locator("td.launcher")).to_have_text("torchrun \u00b7 0a1b2c3d")
    expect(oldest.locator("td.launcher")).to_have_text("torchrun \u00b7 6fd5bf1d")
    expect(oldest.locator("td").nth(4)).to_have_text("1")  # restarts: attempt 1 is the latest
    assert_no_markup_from_data(page)

    page.goto(f"{server.url}/jobs/{first_id}")
    expect(page.locator("#job-launch .launch-cmd")).to_have_text(command)
    expect(page.locator("#job-launcher")).to_have_text("torchrun \u00b7 6fd5bf1d")
    expect(page.locator("#job-launch .tag-run")).to_have_count(0)
    assert_no_markup_from_data(page)
    watched.assert_clean()


HOSTILE_HOST = "<img src=x onerror=alert(1)>"
HOSTILE_ERROR = "boom <script>alert(2)</script> after"
HOSTILE_JOB = "esc<script>alert(3)</script>"
HOSTILE_OP = "<svg onload=alert(4)>"
HOSTILE_DESC = '"><img src=x onerror=alert(5)>'


def test_server_data_is_shown_as_text_never_as_html(server, agents, watched):
    page = watched.page
    agent = agents(HOSTILE_JOB, 0, host=HOSTILE_HOST, device=HOSTILE_HOST)
    agent.send("group", {"name": "0", "desc": HOSTILE_DESC, "ranks": [0, 1]},
               ("heartbeat", {"groups": [{"group": "0", "entered": 2, "completed": 1,
                                          "inflight_op": HOSTILE_OP,
                                          "inflight_since": time.time()}]}))
    agent.collectives(2, op=HOSTILE_OP)
    jid = job_id(server, HOSTILE_JOB)

    page.goto(f"{server.url}/jobs/{jid}")
    expect(page.locator("#live-text")).to_have_text("Live")
    expect(page.locator("#job-name")).to_have_text(HOSTILE_JOB)
    expect(rank_row(page, 0).locator("td").nth(HOST)).to_have_text(HOSTILE_HOST)
    expect(rank_row(page, 0).locator("td").nth(DEVICE)).to_have_text(HOSTILE_HOST)
    expect(page.locator("#groups-body")).to_contain_text(HOSTILE_DESC)
    expect(page.locator("#coll-body")).to_contain_text(HOSTILE_OP)
    expect(page.locator("#progress")).to_contain_text(HOSTILE_OP, timeout=LIVE_MS)

    # An uncaught error marks the rank failed: once the badge says so, the page has had it.
    agent.send("error", {"where": "uncaught", "error_type": "RuntimeError",
                         "error": HOSTILE_ERROR, "op": HOSTILE_OP})
    expect(rank_row(page, 0).locator(".rank-state")).to_have_text("failed", timeout=LIVE_MS)
    assert_no_markup_from_data(page)

    page.goto(server.url + "/")
    expect(page.locator("#jobs-body")).to_contain_text(HOSTILE_JOB)
    assert_no_markup_from_data(page)
    watched.assert_clean()


def assert_no_markup_from_data(page) -> None:
    """Nothing from the hostile strings became an element or an attribute."""
    assert page.locator("img[src='x']").count() == 0, "an <img src=x> was created from data"
    handlers = page.evaluate("""Array.from(document.querySelectorAll('*')).flatMap(e =>
        Array.from(e.attributes).filter(a => /^on/i.test(a.name))
             .map(a => e.tagName + ' ' + a.name))""")
    assert handlers == [], f"inline event handlers in the DOM: {handlers}"
    inline = page.evaluate("Array.from(document.scripts).filter(s => !s.src).length")
    assert inline == 0, "a <script> element without src exists: data was parsed as HTML"
    html = page.content()
    assert "<img src=x" not in html and "<script>alert" not in html and "<svg" not in html
    text = page.locator("body").inner_text()
    if "boom" in text:  # where the page shows error texts, they are shown verbatim
        assert HOSTILE_ERROR in text


def test_job_page_needs_no_network_beyond_the_server(server, agents, watched):
    page = watched.page
    aborted: list[str] = []
    failed: list[str] = []
    seen: list[str] = []

    def gate(route):
        url = route.request.url
        seen.append(url)
        if urlsplit(url).hostname == "127.0.0.1":
            route.fallback()
        else:
            aborted.append(url)
            route.abort("internetdisconnected")

    page.context.route("**/*", gate)
    page.on("requestfailed", lambda req: failed.append(f"{req.url}: {req.failure}"))

    agent = agents("offline", 0)
    agent.send("group", {"name": "0", "ranks": [0, 1]})
    agent.collectives(5)
    jid = job_id(server, "offline")

    page.goto(f"{server.url}/jobs/{jid}")
    expect(page.locator("#live-text")).to_have_text("Live")
    expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text("5")
    agent.collectives(1)
    expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text("6", timeout=LIVE_MS)
    page.wait_for_load_state("networkidle")
    # The rule really was in force: the page's own requests went through it.
    assert any("/static/vendor/socket.io-" in u for u in seen), seen
    assert any("/static/css/pgdash.css" in u for u in seen), seen
    assert aborted == [], f"the page tried to reach outside the server: {aborted}"
    assert failed == [], f"requests failed: {failed}"
    watched.assert_clean()


@pytest.fixture
def hang_server(tmp_path):
    """A server that calls a collective hung after one second (``--hang-after 1``)."""
    srv = ServerProcess(f"sqlite:///{tmp_path / 'hang.db'}", extra=["--hang-after", "1"],
                        log_path=tmp_path / "hang-server.log").start()
    yield srv
    srv.stop()


def test_hang_finding_shows_its_hint_and_highlights_the_rank_at_fault(hang_server, watched):
    page = watched.page
    agents = [FakeAgent(hang_server.url, "hung", rank, host="node-a" if rank < 2 else "node-b",
                        world_size=3) for rank in range(3)]
    try:
        agents[0].send("group", {"name": "0", "desc": "default_pg", "backend": "gloo",
                                 "ranks": [0, 1, 2]})
        stuck_since = time.time() - 5  # longer than --hang-after 1
        for agent in agents[:2]:  # ranks 0 and 1 wait inside all_reduce #5 ...
            agent.send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 4,
                                                 "inflight_op": "all_reduce",
                                                 "inflight_since": stuck_since}]})
        agents[2].send("heartbeat", {"groups": [{"group": "0", "entered": 4,  # ... rank 2 is
                                                 "completed": 4}]})  # still at #4
        jid = job_id(hang_server, "hung")
        wait_for(lambda: any(f["kind"] == "hang" for f in
                             hang_server.api(f"/api/jobs/{jid}/findings")["findings"]),
                 10, "the hang finding")

        page.goto(f"{hang_server.url}/jobs/{jid}")
        expect(page.locator("#live-text")).to_have_text("Live")
        finding = page.locator("#findings li.finding[data-kind='hang']")
        expect(finding).to_have_count(1, timeout=LIVE_MS)
        expect(finding.locator(".finding-summary")).to_contain_text("Rank 2 never reached")
        expect(finding.locator(".blamed")).to_have_text("rank 2")
        expect(finding.locator(".finding-hint")).to_contain_text(
            "Rank 2 never reached that collective")
        expect(page.locator("#job-verdict")).to_have_text("1 critical incident · at fault: rank 2")
        # The page leads with the incident; the title counts it; findings are one click away.
        incident = page.locator("#incidents li.incident[data-incident='hang:r2']")
        expect(incident).to_have_count(1)
        expect(incident.locator(".blamed")).to_have_text("rank 2")
        expect(page).to_have_title(re.compile(r"^\(1\) hung"))
        expect(page.locator("#findings-details")).not_to_have_attribute("open", "")
        incident.locator("details summary").click()
        expect(incident.locator(".chain li")).to_have_count(1)
        expect(incident.locator(".chain li")).to_contain_text("wait in group 0 for rank 2")
        # The incident asked its ranks for a snapshot; rank 2 (played here) answers, and the
        # incident shows the line its training thread stands in.
        # (On a loaded machine the server may fold rank 0's heartbeat before rank 1's: for
        # that moment the hang blames ranks 1 and 2, and its incident asks them first.)
        asked = wait_for(lambda: [a for a in agents[2].asked
                                  if a.get("reason") == "incident hang:r2"], 10,
                         "the incident's question to rank 2")[0]
        assert asked["what"] == "snapshot" and asked["reason"] == "incident hang:r2"
        agents[2].send("snapshot", {"ask": asked["ask"], "asked_at": asked["at"], "threads": [
            {"name": "MainThread", "training": True, "frames": [
                {"file": "/job/train.py", "line": 42, "function": "step",
                 "code": "batch = next(loader)"},
                {"file": "/usr/lib/python3.11/queue.py", "line": 180, "function": "get",
                 "code": "self.not_empty.wait()", "library": True}]}]})
        expect(incident.locator(".incident-snapshot .snapshot-where")).to_have_text(
            "train.py:42 in step: batch = next(loader)", timeout=LIVE_MS)
        expect(incident.locator(".incident-snapshot pre")).to_contain_text("queue.py")
        expect(incident.locator("button.snapshot-ask")).to_have_text("Snapshot again")
        # The Snapshots card lists the incident's request by itself, and shows it.
        expect(page.locator("#snapshot-list option")).to_have_count(1)
        expect(page.locator("#snapshot-view")).to_have_attribute("data-request", asked["ask"])
        # The whole request, every rank asked with the incident, opens in the Snapshots card.
        incident.locator("button.snapshot-open").click()
        view = page.locator("#snapshot-view")
        expect(view).to_have_attribute("data-request", asked["ask"])
        expect(view.locator(".stack-group").first).to_have_attribute("data-ranks", "2")
        page.locator("#findings-details > summary").click()
        # The rank states are on the topology before anything is selected.
        topology = page.locator("#topology")
        expect(topology.locator(".rk[data-rank='2']")).to_have_attribute("data-state", "hung")
        # Its victims wait in the collective: another colour than the rank at fault.
        expect(topology.locator(".rk[data-rank='0']")).to_have_attribute("data-state", "stuck")
        expect(page.locator("#topology-legend")).to_contain_text("hung (at fault) 1")
        expect(topology).to_have_attribute("data-highlight", "")

        finding.locator(".finding-head").click()
        expect(finding).to_have_class(re.compile(r"\bselected\b"))
        expect(topology).to_have_attribute("data-highlight", "2")
        expect(topology.locator(".rk[data-rank='2']")).to_have_class(re.compile(r"\bhl\b"))
        expect(topology.locator(".rk.hl")).to_have_count(1)
        expect(page.locator("#ranks-body tr.hl")).to_have_count(1)
        expect(page.locator("#ranks-body tr.hl td").first).to_have_text("2")
        expect(page.locator("#progress .pg-cell.hl")).to_have_attribute("data-rank", "2")
        assert page.evaluate("window.pgdashJob.highlighted()") == [2]

        # The evidence opens and names the waiting ranks; the selection survives live updates.
        finding.locator("summary").click()
        expect(finding.locator(".ev-fields")).to_contain_text("0, 1")
        agents[2].send("heartbeat", {"groups": [{"group": "0", "entered": 4, "completed": 4}]})
        page.wait_for_timeout(1200)  # at least two live pushes
        expect(finding.locator("details")).to_have_attribute("open", "")
        expect(topology).to_have_attribute("data-highlight", "2")

        finding.locator(".finding-head").click()  # a second click clears it
        expect(topology).to_have_attribute("data-highlight", "")
        expect(topology.locator(".rk.hl")).to_have_count(0)

        # The job list counts the active incident.
        page.goto(hang_server.url + "/")
        expect(page.locator("#jobs-body tr td.incidents")).to_have_text("1", timeout=LIVE_MS)
    finally:
        close_all(agents)
    watched.assert_clean()


def test_the_snapshots_card_asks_ranks_and_groups_their_answers(server, watched):
    """Ask ranks 0-3 from the page: the odd stack out comes first, the wavefront says who is
    where, the timeline draws each shown rank's last collectives and the one in flight, and
    the rank that never answers is named with why."""
    page = watched.page
    agents = [FakeAgent(server.url, "snap", rank, world_size=4) for rank in range(4)]
    try:
        agents[0].send("group", {"name": "0", "ranks": [0, 1, 2, 3]})
        agents[2].send("gpu", {"uuid": "GPU-2", "lost": False, "reasons": [], "xids": [],
                               "values": {"util_gpu": 97.0, "temp_c": 71.0}})
        jid = job_id(server, "snap")
        page.goto(f"{server.url}/jobs/{jid}")
        expect(page.locator("#live-text")).to_have_text("Live")
        page.locator("#snapshot-ranks").fill("0-2,9")
        page.locator("#snapshot-these").click()
        expect(page.locator("#snapshot-status")).to_have_text(
            "this job has no rank 9: its ranks are 0-3")
        expect(page.locator("#snapshot-status")).to_have_class(re.compile(r"\berror\b"))
        page.locator("#snapshot-ranks").fill("0-3")
        page.locator("#snapshot-ranks").press("Enter")
        now = time.time()
        for agent in agents[:3]:
            (asked,) = wait_for(lambda: agent.asked, 10, f"the question to rank {agent.rank}")
            odd = agent.rank == 2
            frames = [{"file": "/job/train.py", "line": 40 if odd else 30,
                       "function": "load" if odd else "step",
                       "code": "time.sleep(3600)" if odd else "dist.all_reduce(t)"}]
            agent.send("snapshot", {
                "ask": asked["ask"], "asked_at": asked["at"],
                "threads": [{"name": "MainThread", "training": True, "frames": frames}],
                "groups": [{"group": "0", "entered": 7 if odd else 8, "completed": 7,
                            "inflight_op": None if odd else "all_reduce",
                            "inflight_since": None if odd else now - 5}],
                "recent": [["0", "all_reduce", 4096, now - 8 + i * 0.5, now - 7.9 + i * 0.5]
                           for i in range(4)]})
        view = page.locator("#snapshot-view")
        groups = view.locator(".stack-group")
        expect(groups).to_have_count(2, timeout=LIVE_MS)
        expect(groups.first).to_have_attribute("data-ranks", "2")
        expect(groups.first.locator(".snapshot-where")).to_have_text(
            "train.py:40 in load: time.sleep(3600)")
        expect(groups.nth(1)).to_have_attribute("data-ranks", "0,1")
        expect(view.locator(".wavefront tr.odd-one td").nth(1)).to_have_text("2")
        # Rank 3 never answers: after the server's wait it is named, with why, and rank 0
        # (same host) is asked to read it from outside.
        missing = view.locator(".snapshot-missing li[data-rank='3']")
        expect(missing).to_contain_text("no answer: asked, silent", timeout=15_000)
        # The reading from outside answers where it is: no py-spy command to run by hand.
        expect(missing).not_to_contain_text("py-spy dump --native --pid")
        peer = wait_for(lambda: next((m for m in agents[0].asked if m["what"] == "peer"), None),
                        10, "the question to read rank 3")
        assert (peer["pid"], peer["rank"]) == (1003, 3)
        agents[0].send("snapshot", {"ask": peer["ask"], "threads": [], "for_rank": 3,
                                    "peer_dump": 'Thread 1003 (active+gil): "MainThread"\n'
                                                 "    match (re/__init__.py:166)\n"
                                                 'Thread 1009 (idle): "pgdash-sender"\n'
                                                 "    Outbox.wait (pgdash_agent/outbox.py:60)\n"})
        expect(missing.locator(".snapshot-outside summary")).to_contain_text(
            "blocked with the GIL held (thread MainThread)", timeout=LIVE_MS)
        expect(missing.locator(".snapshot-outside pre")).to_contain_text("match (re/")
        # The agent's own threads only wait: left out, and said so.
        expect(missing.locator(".snapshot-outside pre")).not_to_contain_text("pgdash-sender")
        expect(missing.locator(".snapshot-outside")).to_contain_text(
            "1 thread of pgdash's agent left out")
        expect(view).to_have_attribute("data-complete", "1")
        expect(page.locator("#snapshot-status")).to_contain_text("3 answered, 1 no answer")
        rows = view.locator(".snapshot-timeline .tl-row")
        expect(rows).to_have_count(3)  # one of each group's few ranks, every answered one
        expect(view.locator(".tl-row[data-rank='0'] .tl-bar:not(.tl-inflight)")).to_have_count(4)
        expect(view.locator(".tl-row[data-rank='0'] .tl-inflight")).to_have_count(1)
        expect(view.locator(".tl-row[data-rank='2'] .tl-inflight")).to_have_count(0)
        expect(view.locator(".snapshot-rank[data-rank='2'] summary")).to_contain_text("1 thread")
        expect(view.locator(".snapshot-rank[data-rank='2']")).to_contain_text("97% busy, 71 °C")
        # The request is listed (stored answers survive; the picker shows it).
        expect(page.locator("#snapshot-list option")).to_have_count(1)
        expect(page.locator("#snapshot-list option").first).to_contain_text("3/4 answered")
    finally:
        close_all(agents)
    watched.assert_clean()


def _ask_ranks_0_1_from_the_page(page, server, agent, job: str) -> None:
    """Open ``job``'s live page (group 0 of ranks 0 and 1, said by ``agent``) and ask ranks
    0-1 for a snapshot from its snapshots card."""
    agent.send("group", {"name": "0", "ranks": [0, 1]})
    page.goto(f"{server.url}/jobs/{job_id(server, job)}")
    expect(page.locator("#live-text")).to_have_text("Live")
    page.locator("#snapshot-ranks").fill("0-1")
    page.locator("#snapshot-ranks").press("Enter")


def test_a_rank_that_ended_before_it_answered_says_so_not_that_it_may_be_blocked(server,
                                                                                  watched):
    """Asked as it went down (an incident's own snapshot comes as its ranks fail): the page
    says how it ended, not that its interpreter may be blocked, nor a py-spy command for a
    pid that is gone."""
    page = watched.page
    agents = [FakeAgent(server.url, "ended", rank, world_size=2) for rank in range(2)]
    try:
        _ask_ranks_0_1_from_the_page(page, server, agents[0], "ended")
        (asked,) = wait_for(lambda: agents[0].asked, 10, "the question to rank 0")
        wait_for(lambda: agents[1].asked, 10, "the question to rank 1")
        agents[0].send("snapshot", {"ask": asked["ask"], "asked_at": asked["at"], "threads": [
            {"name": "MainThread", "training": True,
             "frames": [{"file": "/job/train.py", "line": 30, "function": "step",
                         "code": "dist.all_reduce(t)"}]}]})
        agents[1].send("exit", {"clean": False, "reason": "uncaught exception"})
        missing = page.locator("#snapshot-view .snapshot-missing li[data-rank='1']")
        expect(missing).to_contain_text("no answer: asked, silent: it failed at ",
                                        timeout=15_000)
        expect(missing).to_contain_text(", before it answered")
        expect(missing).not_to_contain_text("blocked")
        expect(missing).not_to_contain_text("py-spy dump")
    finally:
        close_all(agents)
    watched.assert_clean()


def test_errors_are_shown_verbatim_as_text_and_gpus_say_why_they_are_empty(server, agents,
                                                                          watched):
    page = watched.page
    agent = agents("errs", 0, host="node-a")
    agent.send("group", {"name": "0", "ranks": [0, 1]})
    hostile = "Connection reset by peer\n  <img src=x onerror=alert(1)> & <b>bold</b>"
    agent.send("error", {"where": "collective", "error_type": "DistBackendError",
                         "error": hostile, "group": "0", "op": "all_reduce", "seq": 7})
    jid = job_id(server, "errs")

    page.goto(f"{server.url}/jobs/{jid}")
    expect(page.locator("#live-text")).to_have_text("Live")
    item = page.locator("#errors li.error-item")
    expect(item).to_have_count(1, timeout=LIVE_MS)
    expect(item).to_have_attribute("data-rank", "0")
    expect(item.locator(".error-head")).to_contain_text("rank 0")
    expect(item.locator(".error-head")).to_contain_text("DistBackendError")
    expect(item.locator(".error-head")).to_contain_text("all_reduce #7")
    assert item.locator("pre.error-text").text_content() == hostile  # verbatim, newline too
    assert page.locator("#errors img, #errors b").count() == 0
    expect(page.locator("#errors-count")).to_have_text("1 error")
    expect(page.locator("#gpus")).to_have_text(
        "No GPU data: this job runs on CPU, or the agent has no NVML")
    assert_no_markup_from_data(page)
    watched.assert_clean()


def test_gpu_health_shows_each_ranks_reading_and_its_faults(server, agents, watched):
    page = watched.page
    agent = agents("gpu", 0, host="node-a", device="cuda:0")
    agent.send("gpu", {"uuid": "GPU-1234", "name": "NVIDIA H200", "lost": False,
                       "values": {"util_gpu": 87.0, "mem_used": 40e9, "mem_total": 80e9,
                                  "temp_c": 71.0, "power_w": 350.0, "power_limit_w": 400.0,
                                  "sm_clock_mhz": 1410.0, "sm_clock_max_mhz": 1980.0,
                                  "ecc_uncorrected": 0.0},
                       "reasons": ["sw_thermal_slowdown"], "xids": [79]})
    jid = job_id(server, "gpu")

    page.goto(f"{server.url}/jobs/{jid}")
    expect(page.locator("#live-text")).to_have_text("Live")
    row = page.locator("#gpus tbody tr[data-rank='0']")
    expect(row).to_have_count(1, timeout=LIVE_MS)
    cells = row.locator("td")
    expect(cells.nth(1)).to_have_text("NVIDIA H200")
    expect(cells.nth(2)).to_have_text("87%")
    expect(cells.nth(4)).to_have_text("71 °C")
    expect(cells.nth(5)).to_have_text("350 / 400 W")
    expect(cells.nth(7)).to_have_text("sw_thermal_slowdown")
    expect(cells.nth(7)).to_have_class("bad")
    expect(cells.nth(8)).to_contain_text("xid:79")
    expect(page.locator("#gpus-count")).to_have_text("1 GPU")
    watched.assert_clean()


def test_unknown_job_shows_a_clear_not_found_state(server, watched):
    page = watched.page
    # The failed /api/jobs/9999 fetch is the expected outcome; Chromium logs it as an error.
    watched.allow_console(r"status of 404 .*/api/jobs/9999")
    page.goto(server.url + "/jobs/9999")
    error = page.locator("#job-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Job 9999 was not found")
    expect(page.locator("#job-page")).to_have_class(re.compile(r"\bnot-found\b"))
    expect(page.locator("#ranks-body")).to_be_hidden()
    expect(page.locator("#live-text")).to_have_text("Live")
    watched.assert_clean()


def test_job_page_opened_before_the_job_exists_shows_it_when_it_appears(server, agents,
                                                                          watched):
    page = watched.page
    watched.allow_console(r"status of 404 .*/api/jobs/1\b")
    page.goto(server.url + "/jobs/1")
    expect(page.locator("#job-error")).to_contain_text("Job 1 was not found")
    expect(page.locator("#live-text")).to_have_text("Live")

    agent = agents("late", 0)
    agent.collectives(2)
    assert job_id(server, "late") == 1
    # The page re-asks to watch every 5 s while the server has no such job.
    expect(page.locator("#job-name")).to_have_text("late", timeout=12_000)
    expect(page.locator("#job-error")).to_be_hidden()
    expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text("2", timeout=LIVE_MS)
    watched.assert_clean()


def _hang_that_resolves(server, name: str, hold_s: float = 0.0):
    """A 2-rank job whose rank 1 waits in all_reduce #5 that rank 0 has not entered, until
    the hang is found (and ``hold_s`` more); then rank 0 catches up, both exit. Returns
    (job id, its hang finding, the agents: the caller closes them)."""
    agents = [FakeAgent(server.url, name, rank) for rank in range(2)]
    for agent in agents:
        agent.send("group", {"name": "0", "desc": "world", "backend": "gloo", "ranks": [0, 1]})
    agents[1].send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 4,
                                             "inflight_op": "all_reduce",
                                             "inflight_since": time.time()}]})
    agents[0].send("heartbeat", {"groups": [{"group": "0", "entered": 4, "completed": 4}]})
    jid = job_id(server, name)

    def hang():
        return next((f for f in server.api(f"/api/jobs/{jid}/findings")["findings"]
                     if f["kind"] == "hang"), None)

    wait_for(hang, 10, "the hang finding")
    time.sleep(hold_s)
    for agent in agents:  # rank 0 arrives; both complete #5
        agent.send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 5}]})
    wait_for(lambda: not hang()["active"] or None, 10, "the hang to resolve")
    for agent in agents:
        agent.send("exit", {"clean": True, "exitcode": 0})
    wait_for(lambda: job_by_name(server, name)["status"] == "finished" or None, 10,
             "the job to finish")
    return jid, hang(), agents


def test_replay_slider_shows_the_hang_after_it_was_resolved(hang_server, watched):
    """Rank 1 waits in all_reduce #5 that rank 0 has not entered; then rank 0 catches up.
    Live, the hang is resolved; dragged back to the middle of it, the page shows it again,
    with the rank states of that moment, and "Back to live" returns."""
    page = watched.page
    jid, _, agents = _hang_that_resolves(hang_server, "scrub")
    try:
        page.goto(f"{hang_server.url}/jobs/{jid}")
        expect(page.locator("#job-status")).to_have_text("finished", timeout=LIVE_MS)
        live_hang = page.locator("#findings li.finding[data-kind='hang']")
        expect(live_hang).to_have_class(re.compile(r"\bresolved\b"))
        expect(page.locator("#incidents li.incident")).to_have_class(re.compile(r"\bresolved\b"))
        slider = page.locator("#replay-at")
        expect(page.locator("#replay")).to_be_visible()

        # The last moment the hang was judged active, as a slider position over the job's
        # span (between first_seen, when its wait crossed the threshold, and the first
        # moment of the grid that judged it, the server did not know it yet).
        job = hang_server.api(f"/api/jobs/{jid}")
        hang = next(f for f in hang_server.api(f"/api/jobs/{jid}/findings")["findings"]
                    if f["kind"] == "hang")
        moment = hang["last_seen"]
        # Rounded up: a slider step before it may fall before the only moment that judged
        # the hang active (a short one, on a busy machine).
        position = math.ceil(1000 * (moment - job["started_at"]) /
                             max(1.0, job["ended_at"] - job["started_at"]))
        slider.evaluate("(el, v) => { el.value = String(v); "
                        "el.dispatchEvent(new Event('input')); }", position)
        expect(page.locator("#job-page")).to_have_class(re.compile(r"\breplaying\b"))
        expect(page.locator("#job-status")).to_have_text("running")
        replayed = page.locator("#findings li.finding[data-kind='hang']")
        expect(replayed).not_to_have_class(re.compile(r"\bresolved\b"))
        expect(replayed.locator(".blamed")).to_have_text("rank 0")
        expect(page.locator("#incidents li.incident[data-incident='hang:r0']")).not_to_have_class(
            re.compile(r"\bresolved\b"))
        expect(page.locator("#topology .rk[data-rank='0']")).to_have_attribute(
            "data-state", "hung")
        expect(page.locator("#topology .rk[data-rank='1']")).to_have_attribute(
            "data-state", "stuck")

        # A moment slow to come (a big job's takes the server seconds) says so, and the page
        # meanwhile goes on showing the moment before it, said as such.
        held = []

        def hold(route):
            held.append(route)

        page.route(re.compile(r"/state\?at="), hold)
        slider.evaluate("el => { el.value = '1000'; el.dispatchEvent(new Event('input')); }")
        expect(page.locator("#job-page")).to_have_class(re.compile(r"\breplay-pending\b"))
        expect(page.locator("#replay-when")).to_contain_text("loading")
        expect(page.locator("#replay-when")).to_contain_text("showing")
        expect(replayed).not_to_have_class(re.compile(r"\bresolved\b"))
        assert len(held) == 1
        held[0].continue_()
        page.unroute(re.compile(r"/state\?at="))
        expect(page.locator("#job-page")).not_to_have_class(re.compile(r"\breplay-pending\b"))
        expect(page.locator("#replay-when")).not_to_contain_text("loading")
        expect(replayed).to_have_class(re.compile(r"\bresolved\b"))

        page.locator("#replay-live").click()
        expect(page.locator("#job-page")).not_to_have_class(re.compile(r"\breplaying\b"))
        expect(page.locator("#job-status")).to_have_text("finished")
        expect(live_hang).to_have_class(re.compile(r"\bresolved\b"))
        watched.assert_clean()
    finally:
        for agent in agents:
            agent.close()


def _js_number(t: float) -> str:
    """A number as the page writes it (String(t)): 1796404104, not 1796404104.0."""
    return str(int(t)) if float(t).is_integer() else repr(float(t))


def test_dragging_a_big_stored_job_shows_keyframes_then_the_moment_it_stops_at(tmp_path,
                                                                               watched):
    """A 256-rank job (a moment costs the server a fold of seconds): while the slider moves,
    the page asks for the keyframe before each moment (``&within=``, a read) and says which
    moment it shows; let go, it shows the exact moment where the slider stopped."""
    from tests.helpers.storedjob import keyframe_moments, stored_job

    job_id, _, _ = stored_job(tmp_path / "big.sqlite", 256, 60)
    srv = ServerProcess(f"sqlite:///{tmp_path / 'big.sqlite'}",
                        log_path=tmp_path / "big-server.log").start()
    try:
        page = watched.page
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/state?at=" in r.url else None)
        page.goto(f"{srv.url}/jobs/{job_id}")
        expect(page.locator("#job-status")).to_have_text("finished", timeout=LIVE_MS)
        # Opening the ended job had the server store the seconds around its incident (in the
        # background, a quarter of the time): once it is done, those are keyframes too.
        wait_for(lambda: (metric(srv, "pgdash_incident_marks_prepared_total") or 0) >= 1
                 and metric(srv, "pgdash_incident_frames_jobs") == 0, 120,
                 "the incident's moments prepared")
        kept = keyframe_moments(tmp_path / "big.sqlite", job_id)
        job = srv.api(f"/api/jobs/{job_id}")
        start, end = job["started_at"], job["ended_at"]
        slider, shown = page.locator("#replay-at"), page.locator("#job-page")
        # Resting 400 ms on a moment shown asks for the second after it, then (256 ranks) the
        # incident marks on either side: asked whenever the machine lets the timer fire.
        incidents = srv.api(f"/api/jobs/{job_id}/incidents")["incidents"]
        aheads = [f"at={_js_number(t)}" for inc in incidents
                  for t in (inc["first_seen"], inc["last_seen"]) if t is not None]
        for value in (300, 500):
            # (a position between keyframes: around the incident there is one every second)
            value = next(v for v in range(value, value + 20)
                         if start + (end - start) * v / 1000 not in kept)
            slider.evaluate("(el, v) => { el.value = String(v); "
                            "el.dispatchEvent(new Event('input')); }", value)
            at = start + (end - start) * value / 1000
            keyframe = max(k for k in kept if k <= at)  # the newest before it (30 s at most)
            assert at - 30 <= keyframe < at, kept
            expect(shown).to_have_attribute("data-replayed", _js_number(keyframe))
            expect(page.locator("#replay-when")).not_to_contain_text("loading")
            aheads.append(f"at={_js_number(keyframe + 1)}")
        assert any("&within=30" in url for url in asked) and all(
            "&within=30" in url or url.endswith(tuple(aheads)) for url in asked), asked
        expect(page.locator("#topology .rk")).to_have_count(256)
        # Let go: the moment where the slider is, folded. While it comes, the keyframe stays
        # on screen undimmed, and the label says which moment is shown and which is coming.
        held: list = []
        exact = f"at={_js_number(at)}"
        page.route(re.compile(r"/state\?at=[0-9.]+$"), lambda route: held.append(route)
                   if route.request.url.endswith(exact) else route.continue_())
        page.evaluate("delete document.getElementById('job-page').dataset.aheadMarks")
        let_go = len(asked)
        slider.evaluate("el => el.dispatchEvent(new Event('change'))")
        for _ in range(50):  # route handlers run while Playwright has the thread
            if held:
                break
            page.wait_for_timeout(200)
        assert held, "the exact moment was not asked"
        page.wait_for_timeout(600)  # past the page's 300 ms before it says "loading"
        expect(page.locator("#replay-when")).to_contain_text("loading")
        expect(page.locator("#replay-when")).to_contain_text("showing")
        expect(shown).not_to_have_class(re.compile(r"\breplay-pending\b"))
        held[0].continue_()
        page.unroute(re.compile(r"/state\?at=[0-9.]+$"))
        expect(shown).to_have_attribute("data-replayed", _js_number(at), timeout=LIVE_MS)
        # The first moment asked once let go is the exact one. (What resting on the keyframe
        # asked ahead may come just before the let-go: on a loaded machine, after this line.)
        after = [u for u in asked[let_go:] if u.endswith(exact) or not u.endswith(tuple(aheads))]
        assert after and after[0].endswith(exact), asked
        # Resting there, the page asks for the next second and the incident marks on either
        # side (exact moments): once it has, only Play asks.
        expect(shown).to_have_attribute("data-ahead-marks", re.compile(r".*"), timeout=LIVE_MS)
        # Play at 10x: keyframes too (each tick moves 5 s); at 1x the exact moments. What
        # resting on the exact moment asked ahead (the second after it) may come late on a
        # loaded machine, after Play began: not Play's.
        rested = tuple(aheads) + (f"at={_js_number(at + 1)}",)
        for speed, near in (("10", True), ("1", False)):
            page.select_option("#replay-speed", speed)
            del asked[:]
            page.click("#replay-play")
            plays: list = []
            for _ in range(50):
                plays = [url for url in asked if not url.endswith(rested)]
                if len(plays) >= 2:
                    break
                page.wait_for_timeout(200)
            page.click("#replay-play")  # pause
            # The first two are Play's (resting after the pause may ask a second ahead).
            assert len(plays) >= 2 and all(("&within=" in url) == near for url in plays[:2]), \
                asked
    finally:
        srv.stop()


def test_a_silent_rank_alone_on_its_host_says_why_nobody_read_it(server, watched):
    """Rank 1 is alone on node-b and never answers: no rank of its host can read it from
    outside, and the card says so beside the py-spy command to run there."""
    page = watched.page
    agents = [FakeAgent(server.url, "alone", 0, world_size=2),
              FakeAgent(server.url, "alone", 1, world_size=2, host="node-b")]
    try:
        _ask_ranks_0_1_from_the_page(page, server, agents[0], "alone")
        (asked,) = wait_for(lambda: agents[0].asked, 10, "the question to rank 0")
        agents[0].send("snapshot", {"ask": asked["ask"], "threads": [
            {"name": "MainThread", "training": True,
             "frames": [{"file": "/job/train.py", "line": 30, "function": "step",
                         "code": "dist.all_reduce(t)"}]}]})
        missing = page.locator("#snapshot-view .snapshot-missing li[data-rank='1']")
        expect(missing.locator(".snapshot-outside")).to_have_text(
            "Not read from outside: no other rank of its host answered (alone there, or all "
            "silent), and no host reader of it is connected here (pgdash_agent.reader: it "
            "needs py-spy on the host and protocol v2, and PGDASH_HOST_READER and "
            "PGDASH_PEER_READ left on), so nobody there could read it", timeout=15_000)
        expect(missing).to_contain_text("py-spy dump --native --pid 1001` on node-b")
        assert not [m for m in agents[0].asked if m["what"] == "peer"]
        watched.assert_clean()
    finally:
        close_all(agents)


def test_a_moment_shown_or_asked_ahead_is_shown_again_without_asking_the_server(
        hang_server, watched):
    """Resting on a moment, the page asks for the second after it; → then shows that second
    with no new request, and ← goes back to a moment already shown, also with none."""
    page = watched.page
    jid, _found, agents = _hang_that_resolves(hang_server, "kept", hold_s=2.5)
    try:
        job = hang_server.api(f"/api/jobs/{jid}")
        at = job["started_at"] + 1
        asked = []
        page.on("request", lambda req: asked.append(req.url) if "/state?at=" in req.url else None)

        def times(t):  # requests for moment t
            return sum(u.endswith("/state?at=" + _js_number(t)) for u in asked)

        page.goto(f"{hang_server.url}/jobs/{jid}?at={_js_number(at)}")
        shown = page.locator("#job-page")
        expect(shown).to_have_attribute("data-replayed", _js_number(at), timeout=LIVE_MS)
        expect(shown).to_have_attribute("data-ahead", _js_number(at + 1), timeout=LIVE_MS)
        assert times(at + 1) == 1, asked
        expect(page.locator("#replay")).to_be_visible()  # once the job's span is known
        page.locator("#replay-at").focus()
        page.keyboard.press("ArrowRight")
        expect(shown).to_have_attribute("data-replayed", _js_number(at + 1))
        expect(shown).to_have_attribute("data-ahead", _js_number(at + 2))  # resting on at + 1
        page.keyboard.press("ArrowLeft")
        expect(shown).to_have_attribute("data-replayed", _js_number(at))
        assert (times(at), times(at + 1)) == (1, 1), asked
        # The next incident mark was asked ahead too (the job has 2 ranks): Shift+→ asks
        # nothing new.
        incident = hang_server.api(f"/api/jobs/{jid}/incidents")["incidents"][0]
        mark = min(t for t in (incident["first_seen"], incident["last_seen"]) if t > at + 0.5)
        expect(shown).to_have_attribute("data-ahead-marks",
                                        re.compile(re.escape(_js_number(mark))))
        page.keyboard.press("Shift+ArrowRight")
        expect(shown).to_have_attribute("data-replayed", _js_number(mark))
        assert times(mark) == 1, asked
        watched.assert_clean()
    finally:
        for agent in agents:
            agent.close()


def test_scrubbing_by_keys_by_incident_and_comparing_two_moments(hang_server, watched):
    """The hang job of the test above, ended: Home goes to its start, Shift+→ to the moment
    its incident began, → a second on; a drag while a moment loads asks only for where the
    slider stopped; A pinned inside the hang and B at the end say that the hang resolved and
    rank 0 stopped being hung."""
    page = watched.page
    jid, found, agents = _hang_that_resolves(hang_server, "keys", hold_s=2.5)
    try:
        job = hang_server.api(f"/api/jobs/{jid}")
        incident = hang_server.api(f"/api/jobs/{jid}/incidents")["incidents"][0]

        page.goto(f"{hang_server.url}/jobs/{jid}")
        expect(page.locator("#job-status")).to_have_text("finished", timeout=LIVE_MS)
        slider = page.locator("#replay-at")
        expect(page.locator("#replay-marks option")).to_have_count(2)  # opened, resolved
        shown = page.locator("#job-page")
        slider.focus()
        page.keyboard.press("Home")
        expect(shown).to_have_attribute("data-replayed", str(job["started_at"]))
        page.keyboard.press("Shift+ArrowRight")
        expect(shown).to_have_attribute("data-replayed", _js_number(incident["first_seen"]))
        # Where the wait crossed the threshold the server had not judged it yet: the page
        # says an incident begins there, not "no active incidents"; a second on, it is named.
        verdict = page.locator("#job-verdict")
        expect(verdict).to_have_attribute("data-forming", incident["id"])
        expect(verdict).to_have_text(
            "an incident begins here (hang), named at the next judgement \u00b7 at fault: rank 0")
        page.keyboard.press("ArrowRight")
        expect(shown).to_have_attribute("data-replayed", _js_number(incident["first_seen"] + 1))
        expect(verdict).to_have_text("1 critical incident \u00b7 at fault: rank 0")
        expect(verdict).to_have_attribute("data-forming", "")
        assert "at=" in page.url
        # Resting there, the page asks for the second after it, and the incident marks on
        # either side (a small job).
        expect(shown).to_have_attribute("data-ahead", _js_number(incident["first_seen"] + 2))
        at = incident["first_seen"] + 1
        marks = sorted({incident["first_seen"], incident["last_seen"]})
        around = [t for t in marks if t > at + 0.5][:1] + [t for t in marks if t < at - 0.5][-1:]
        expect(shown).to_have_attribute("data-ahead-marks", " ".join(map(_js_number, around)))

        # Dragging while a moment loads: the moments in between are not asked for; the
        # one where the slider stopped is, once the one loading has come.
        held = []
        page.route(re.compile(r"/state\?at="), lambda route: held.append(route))
        for value in ("100", "400", "700"):
            slider.evaluate("(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                            value)
        def routed(n, requests=held):  # route handlers run while Playwright has the thread
            for _ in range(50):
                if len(requests) >= n:
                    return
                page.wait_for_timeout(200)
            raise AssertionError(f"{len(requests)} requests held, not {n}")

        routed(1)
        page.wait_for_timeout(300)
        assert len(held) == 1
        held[0].continue_()
        routed(2)
        end = job["ended_at"]
        asked = float(re.search(r"at=([0-9.]+)", held[1].request.url).group(1))
        assert abs(asked - (job["started_at"] + 0.7 * (end - job["started_at"]))) < 0.01
        held[1].continue_()
        page.unroute(re.compile(r"/state\?at="))
        expect(shown).to_have_attribute("data-replayed", str(asked))

        # A link to where the incident begins (the page's address there) says so too, once
        # the page has learnt the job's incidents after the moment itself came.
        late = []
        page.route(re.compile(r"/incidents$"), lambda route: late.append(route))
        page.goto(f"{hang_server.url}/jobs/{jid}?at={incident['first_seen']}")
        expect(shown).to_have_attribute("data-replayed", _js_number(incident["first_seen"]))
        routed(1, late)
        expect(verdict).to_have_attribute("data-forming", "")  # not known yet
        late[0].continue_()
        page.unroute(re.compile(r"/incidents$"))
        expect(verdict).to_have_attribute("data-forming", incident["id"])

        # A inside the hang, B at the end.
        inside = found["last_seen"]
        page.goto(f"{hang_server.url}/jobs/{jid}?at={inside}")
        expect(page.locator("#findings li.finding[data-kind='hang']")).not_to_have_class(
            re.compile(r"\bresolved\b"))
        page.locator("#replay-pin").click()
        expect(page.locator("#compare")).to_contain_text("move to another moment")
        slider.focus()
        page.keyboard.press("End")
        compare = page.locator("#compare")
        expect(compare).to_have_attribute("data-b", str(end))
        expect(compare.locator(".compare-head")).to_contain_text("From A")
        expect(compare).to_contain_text("Findings that resolved")
        expect(compare).to_contain_text("rank 0 hung → exited")
        page.locator(".compare-clear").click()
        expect(compare).to_be_hidden()
    finally:
        close_all(agents)
    watched.assert_clean()


def test_a_desync_colours_the_rank_that_called_another_collective(server, agents, watched):
    page = watched.page
    ranks = [agents("mismatch", r, world_size=3) for r in range(3)]
    for r, agent in enumerate(ranks):
        agent.send("group", {"name": "0", "desc": "world", "backend": "gloo",
                             "ranks": [0, 1, 2]})
        agent.send("heartbeat", {"groups": [{
            "group": "0", "entered": 6, "completed": 5, "inflight_since": time.time(),
            "inflight_op": "broadcast" if r == 2 else "all_reduce",
            "inflight_dtype": "float32", "inflight_bytes": 4}]})
    jid = job_id(server, "mismatch")
    page.goto(f"{server.url}/jobs/{jid}")
    expect(page.locator("#findings li.finding[data-kind='desync']")).to_have_count(
        1, timeout=LIVE_MS)
    expect(page.locator("#job-verdict")).to_contain_text("at fault: rank 2")
    topology = page.locator("#topology")
    expect(topology.locator(".rk[data-rank='2']")).to_have_attribute("data-state", "mismatch")
    expect(topology.locator(".rk[data-rank='0']")).to_have_attribute("data-state", "waiting")
    expect(page.locator("#topology-legend")).to_contain_text("called another collective 1")


def test_collectives_issued_from_cpp_are_shown_apart_with_their_exactness(server, agents,
                                                                          watched):
    page = watched.page
    r0 = agents("fr-page", 0)
    r0.send("group", {"name": "0", "desc": "world", "backend": "gloo", "ranks": [0, 1]})
    now = time.time()
    r0.send("coll_stats", {"start": now - 1, "end": now, "rows": [
        {"group": "0", "op": "all_reduce", "count": 3, "bytes": 12, "sum_us": 150.0,
         "max_us": 80.0, "hist": [[45, 3]]},
        {"group": "0", "op": "all_reduce", "count": 40, "bytes": 40 * 68384,
         "sum_us": 40 * 9000.0, "max_us": 24000.0, "hist": [[105, 40]],
         "source": "flight_recorder", "timing": "host_poll", "resolution_us": 25000.0}]})
    page.goto(f"{server.url}/jobs/{job_id(server, 'fr-page')}")
    rows = page.locator("#coll-body tr")
    expect(rows).to_have_count(2)
    cpp = rows.filter(has_text="all_reduce (C++)")
    expect(cpp).to_contain_text("40")
    expect(cpp.locator("td.mono")).to_have_attribute(
        "title", re.compile(r"Flight Recorder; latency exact to 25(\.0)? ms"))
    expect(page.locator("#latency-chart")).to_contain_text("world all_reduce (C++) p50")
    watched.assert_clean()


# -- a restarted job: its attempts listed, the earlier attempt's findings marked -------------

class AttemptRank:
    """One rank's agent of one attempt, over a real websocket in the real wire format."""

    def __init__(self, url: str, job: str, rank: int, attempt: int):
        self.seq = 0
        self.client = agent_client(url, {"v": PROTOCOL_VERSION, "session": uuid.uuid4().hex,
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


def test_job_page_lists_the_attempts_of_a_restarted_job(server, watched):
    page = watched.page
    first = [AttemptRank(server.url, "restarted", r, 0) for r in (0, 1)]
    first[1].send("error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": "<b>boom</b> in attempt 0"})
    first[1].send("exit", {"clean": False, "reason": "uncaught exception"})
    first[0].send("exit", {"clean": False, "reason": "SIGTERM from torchrun"})
    for rank in first:
        disconnect(rank.client)
    second = [AttemptRank(server.url, "restarted", r, 1) for r in (0, 1)]
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
        # (judged and pushed after the attempts: on a loaded machine, more than 5 s later)
        finding = page.locator("[data-finding=\"rank_failed:-:r1\"]")
        expect(finding).to_contain_text("attempt 0", timeout=LIVE_MS)
        expect(finding).to_contain_text("resolved", timeout=LIVE_MS)
        # the attempt's error text is data: shown as typed, never parsed as HTML
        expect(page.locator("#errors")).to_contain_text("<b>boom</b> in attempt 0",
                                                        timeout=LIVE_MS)
        assert page.locator("#errors b").count() == 0

        for rank in second:  # the second attempt ends well: the list follows live
            rank.send("exit", {"clean": True, "reason": "exit"})
        expect(items.nth(1)).to_contain_text("finished", timeout=LIVE_MS)
    finally:
        for rank in second:
            disconnect(rank.client)


def replayed_page(page) -> dict:
    """What a person sees of a replayed moment: rank states, findings, incidents, progress,
    the ranks table, the header, the heat map's pixels, errors and GPUs."""
    expect(page.locator("#job-page")).to_have_attribute("data-replayed", re.compile(r"^\d"),
                                                        timeout=LIVE_MS)
    page.wait_for_timeout(300)  # the heat map draws on the frame after the data
    return {
        "states": page.eval_on_selector_all(
            "#topology .rk", "els => els.map(e => [e.dataset.rank, e.dataset.state])"),
        "text": {sel: page.locator(sel).text_content() for sel in (
            "#job-meta", "#job-verdict", "#incidents", "#findings", "#progress",
            "#ranks-body", "#errors", "#gpus", "#topology-legend", "#coll-body")},
        "heatmap": page.eval_on_selector("#heatmap canvas", "c => c.toDataURL()"),
    }


def test_a_moment_opened_by_its_address_looks_the_same_every_time(hang_server, watched):
    """/jobs/<id>?at=T shows the page at T: the hang that was active then, with its rank
    states, progress, heat map, errors and GPUs; opened again later (the relative times and
    the verdicts would drift if the browser's clock judged them) it shows the same. Then
    replay plays forward at the chosen speed; a bad moment says why."""
    page = watched.page
    agents = [FakeAgent(hang_server.url, "moment", rank) for rank in range(2)]
    try:
        for agent in agents:
            agent.send("group", {"name": "0", "desc": "world", "backend": "gloo",
                                 "ranks": [0, 1]})
            agent.collectives(20 + 10 * agent.rank)
        agents[1].send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 4,
                                                 "inflight_op": "all_reduce",
                                                 "inflight_since": time.time()}]})
        agents[0].send("heartbeat", {"groups": [{"group": "0", "entered": 4, "completed": 4}]})
        jid = job_id(hang_server, "moment")
        hang = wait_for(lambda: next((f for f in hang_server.api(
            f"/api/jobs/{jid}/findings")["findings"] if f["kind"] == "hang"), None),
            10, "the hang finding")
        time.sleep(1.0)
        moment = hang["first_seen"] + 0.5
        for agent in agents:  # rank 0 arrives, both complete #5, then the job ends
            agent.send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 5}]})
        wait_for(lambda: not hang_server.api(f"/api/jobs/{jid}/findings")["findings"][0][
            "active"] or None, 10, "the hang to resolve")

        page.goto(f"{hang_server.url}/jobs/{jid}?at={moment}")
        first = replayed_page(page)
        expect(page.locator("#job-page")).to_have_class(re.compile(r"\breplaying\b"))
        assert ["0", "hung"] in first["states"] and ["1", "stuck"] in first["states"]
        expect(page.locator("#topology-legend")).to_contain_text("hung (at fault) 1")
        assert "active" in first["text"]["#findings"] and "resolved" not in \
            first["text"]["#findings"]
        assert "1 behind" in first["text"]["#progress"]
        expect(page.locator("#coll-body tr")).to_have_count(1)  # collectives of that moment
        assert page.evaluate("window.pgdashJob.at()") == moment

        page.wait_for_timeout(2500)  # long enough for any clock-based label or verdict to move
        assert replayed_page(page) == first, "the moment changed while it was on screen"
        page.goto(f"{hang_server.url}/jobs/{jid}?at={moment}")
        assert replayed_page(page) == first, "the moment looked different when opened again"

        # Play: the moment moves forward at the chosen speed, the address follows it.
        page.select_option("#replay-speed", "60")
        page.locator("#replay-play").click()
        expect(page.locator("#replay-play")).to_have_attribute("aria-pressed", "true")
        page.wait_for_function(f"window.pgdashJob.at() > {moment} + 5", timeout=LIVE_MS)
        # Slowed down first: at 60x a short job's end comes within a tick, playing pauses
        # there by itself, and a click would start it over.
        page.select_option("#replay-speed", "1")
        if page.locator("#replay-play").get_attribute("aria-pressed") == "true":
            page.locator("#replay-play").click()
        expect(page.locator("#replay-play")).to_have_attribute("aria-pressed", "false")
        assert float(re.search(r"at=([\d.]+)", page.url).group(1)) > moment

        # A moment that is none: said on the page, and the page shows the job live.
        watched.allow_console(r"status of 400.*state\?at=99")  # the API's answer, as designed
        for bad, reason in (("soon", "which is not a time"), ("99", "is before job")):
            page.goto(f"{hang_server.url}/jobs/{jid}?at={bad}")
            expect(page.locator("#replay-error")).to_contain_text(reason, timeout=LIVE_MS)
            expect(page.locator("#job-page")).not_to_have_class(re.compile(r"\breplaying\b"))
            expect(page.locator("#job-status")).to_have_text("running", timeout=LIVE_MS)
        watched.assert_clean()
    finally:
        close_all(agents)


# -- one page, one story: every section says the same of a rank, of the collectives, of when --

def test_a_hung_rank_reads_hung_in_the_table_the_topology_and_progress_alike(hang_server,
                                                                           watched):
    """Rank 1 of two never reaches all_reduce #5 (its agent says it runs, idle between
    collectives); once the server calls it a hang, the ranks table says "hung" with the
    finding's reason, exactly as the topology, and never "running" or "idle"."""
    page = watched.page
    agents = [FakeAgent(hang_server.url, "hung2", rank) for rank in range(2)]
    try:
        agents[0].send("group", {"name": "0", "desc": "world", "backend": "gloo",
                                 "ranks": [0, 1]})
        agents[0].send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 4,
                                                 "inflight_op": "all_reduce",
                                                 "inflight_since": time.time() - 5}]})
        agents[1].send("heartbeat", {"groups": [{"group": "0", "entered": 4,
                                                 "completed": 4}]})
        jid = job_id(hang_server, "hung2")
        hang = wait_for(lambda: next((f for f in hang_server.api(
            f"/api/jobs/{jid}/findings")["findings"] if f["kind"] == "hang"), None),
            10, "the hang finding")
        assert hang["ranks"] == [1]

        page.goto(f"{hang_server.url}/jobs/{jid}")
        topology = page.locator("#topology .rk[data-rank='1']")
        expect(topology).to_have_attribute("data-state", "hung", timeout=LIVE_MS)
        row = rank_row(page, 1)
        expect(row).to_have_attribute("data-state", "hung")
        state_cell = row.locator("td").nth(STATUS)
        expect(state_cell.locator(".rank-state")).to_have_text("hung (at fault)")
        # Its reason is the finding's summary (whose "waited N s" moves on).
        expect(state_cell.locator(".rank-reason")).to_contain_text(
            hang["summary"].split(":")[0] + ": rank 0 has waited")
        expect(state_cell).not_to_contain_text("running")
        expect(row.locator("td").nth(9)).not_to_contain_text("idle")
        # Its victim: waiting on it, in the table as on the topology.
        expect(page.locator("#topology .rk[data-rank='0']")).to_have_attribute(
            "data-state", "stuck")
        expect(rank_row(page, 0).locator(".rank-state")).to_have_text("waiting on a hang")
        expect(rank_row(page, 0).locator(".rank-reason")).to_contain_text(
            "in all_reduce on group 0 (world), waiting for rank 1")
        # The counts above the table are of the same states as the topology's legend.
        expect(page.locator("#ranks-summary")).to_contain_text("1 hung (at fault)")
        expect(page.locator("#ranks-summary")).not_to_contain_text("running")
        expect(page.locator("#topology-legend")).to_contain_text("hung (at fault) 1")
        # Progress names the same state for the rank behind.
        expect(page.locator("#progress .pg-cell[data-rank='1']")).to_have_attribute(
            "title", re.compile(r"hung \(at fault\)"))
        expect(page.locator("#job-verdict")).to_have_text("1 critical incident · at fault: rank 1")
        assert page.evaluate("window.pgdashJob.rankState(1)") == "hung"
    finally:
        close_all(agents)
    watched.assert_clean()


def test_a_ddp_only_job_draws_its_cpp_collectives_on_every_chart(server, watched, tmp_path):
    """A real 2-rank DDP job whose only collectives are DDP's gradient all-reduces, issued
    from C++ (PGDASH_DDP_HOOK=0: the agent sees them through the Flight Recorder only). The
    charts and the heat map draw them, as the table below them lists them."""
    page = watched.page
    procs = launch_job("ddp_only_job.py", 2, server.url, "ddp-only", tmp_path,
                       env={"PGDASH_DDP_HOOK": "0"}, args=["150", "0.1"])
    try:
        jid = job_id(server, "ddp-only")
        wait_for(lambda: any(r["source"] == "flight_recorder" for r in server.api(
            f"/api/jobs/{jid}/collectives")["collectives"]) or None, 60,
            "collectives from the Flight Recorder")
        assert not any(r["source"] == "wrapper" for r in server.api(
            f"/api/jobs/{jid}/collectives")["collectives"])  # C++ only: nothing Python issued

        page.goto(f"{server.url}/jobs/{jid}")
        expect(page.locator("#coll-body")).to_contain_text("all_reduce (C++)", timeout=LIVE_MS)
        expect(page.locator("#latency-chart")).to_contain_text("all_reduce (C++) p50",
                                                               timeout=LIVE_MS)
        expect(page.locator("#latency-chart canvas")).not_to_have_count(0)
        expect(page.locator("#bytes-chart canvas")).not_to_have_count(0)
        expect(page.locator("#heatmap canvas")).to_have_count(1, timeout=LIVE_MS)
        expect(page.locator("#heat-note")).to_contain_text("Flight Recorder")
        for chart in ("#latency-chart", "#bytes-chart", "#heatmap"):
            expect(page.locator(chart)).not_to_contain_text("No collectives")
        assert wait_job(procs, 90, tmp_path) == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    watched.assert_clean()


def test_a_replayed_moment_says_replay_not_live_and_an_ended_job_says_it_ended(server, agents,
                                                                             watched):
    """/jobs/<id>?at=T: the indicator says "Replay" and the moment instead of "Live", with
    the way back; once the job ended its page says so (no "Live"), and a replay of it
    counts back from its end."""
    page = watched.page
    ranks = [agents("replayed", r) for r in range(2)]
    for r in ranks:
        r.send("group", {"name": "0", "desc": "world", "backend": "gloo", "ranks": [0, 1]})
        r.collectives(10)
    jid = job_id(server, "replayed")
    moment = time.time()
    time.sleep(1.0)

    page.goto(f"{server.url}/jobs/{jid}?at={moment}")
    expect(page.locator("#job-page")).to_have_attribute("data-replayed", re.compile(r"^\d"),
                                                        timeout=LIVE_MS)
    live = page.locator("#live")
    expect(live).to_have_attribute("data-state", "replay")
    expect(page.locator("#live-text")).to_contain_text("Replay")
    expect(page.locator("#live-text")).to_contain_text(
        page.evaluate(f"import('/static/js/common.js').then(m => m.PG.fmtTime({moment}))")[11:])
    expect(page.locator("#live-text")).to_contain_text("ago")  # the job still runs
    expect(page.locator("#live-updated")).to_have_text("")
    page.wait_for_timeout(1500)  # the socket's messages keep coming: still a replay
    expect(page.locator("#live-text")).not_to_contain_text("Live")
    back = page.locator("#replay-live")
    expect(back).to_have_text("Back to live")
    back.click()
    expect(page.locator("#live-text")).to_have_text("Live", timeout=LIVE_MS)
    expect(live).to_have_attribute("data-state", "live")

    for r in ranks:
        r.send("exit", {"clean": True, "reason": "exit"})
    expect(page.locator("#job-status")).to_have_text("finished", timeout=LIVE_MS)
    expect(live).to_have_attribute("data-state", "ended")
    expect(page.locator("#live-text")).to_contain_text("Ended")
    expect(page.locator("#live-text")).not_to_contain_text("Live")

    page.goto(f"{server.url}/jobs/{jid}?at={moment}")
    expect(page.locator("#job-page")).to_have_attribute("data-replayed", re.compile(r"^\d"),
                                                        timeout=LIVE_MS)
    expect(page.locator("#live-text")).to_contain_text("before the end", timeout=LIVE_MS)
    expect(page.locator("#replay-live")).to_have_text("Back to the end")
    watched.assert_clean()
