"""Scrubbing a stored job in the page: moments shown a second while dragging, and playing.

What runs: a stored job (``--db``, made by ``python -m bench.storage --no-export --db FILE``;
made here when it does not exist, ``--ranks`` x ``--minutes``) served by a real ``pgdash
serve`` of this checkout, and, with ``--reference PATH``, by the one of another checkout (e.g.
``git worktree add /tmp/scrub-ref <commit>``) on a copy of the same file (a job that ended:
``bench.storage --end``): the same job, the
same machine, the page and the server of each. In headless Chromium (the system
``chromium``) on each server, after one moment is on screen:

* **drag**: the slider moved from 10% to 90% of the job's span over ``--drag-s`` seconds, an
  input event every 16 ms (a mouse drag at 60 Hz); counted: the moments the page showed
  while the slider moved, per second (goal, issue 27: at least 5 at 1,024 ranks), the
  ``state?at=`` requests it made, and the seconds from the release to the moment where the
  slider stopped being on screen;
* **play**: Play at ``--speed`` x for ``--play-s`` seconds: moments shown a second, and how far
  the job's time advanced against the ``speed`` x wall seconds asked (keeping up: 100%).

A measurement, not a test: exit status 0 whatever the figures. From the repository root::

    python -m bench.scrub                                   # 32 ranks x 10 min, made here
    git worktree add /tmp/scrub-ref 4a3e4b0
    python -m bench.scrub --reference /tmp/scrub-ref        # before/after in one run
    python -m bench.scrub --db job.db --reference /tmp/scrub-ref   # a job bench.storage kept
    python -m bench.scrub --db new.db --reference /tmp/scrub-ref --reference-db old.db
        # the same job stored by each checkout (keyframes are stored as the job runs)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import fmt
from tests.helpers.procs import ROOT, ServerProcess

CHROMIUM = "/usr/bin/chromium"

# Stamps every moment the page shows (#job-page data-replayed) with the time it showed.
OBSERVE = """() => {
  window.__shown = [];
  const page = document.getElementById('job-page');
  new MutationObserver(() => window.__shown.push([performance.now(), page.dataset.replayed]))
    .observe(page, {attributes: true, attributeFilter: ['data-replayed']});
}"""


def make_job(db: Path, ranks: int, minutes: float) -> None:
    hang_at, hang_for = minutes / 2, minutes / 5
    print(f"making the job: python -m bench.storage --ranks {ranks} --minutes {minutes:g} "
          f"--hang-at {hang_at:g} --hang-for {hang_for:g} --end --no-export --db {db}",
          flush=True)
    subprocess.run([sys.executable, "-m", "bench.storage", "--ranks", str(ranks),
                    "--minutes", f"{minutes:g}", "--hang-at", f"{hang_at:g}", "--hang-for",
                    f"{hang_for:g}", "--moments", "2", "--end", "--no-export", "--db", str(db)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def measure(browser, server: ServerProcess, args) -> dict:
    job = json.loads(_get(server.url + "/api/jobs"))["jobs"][0]
    detail = json.loads(_get(f"{server.url}/api/jobs/{job['id']}"))
    start, end = detail["started_at"], detail["ended_at"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "/state?at=" in r.url else None)
    try:
        first = start + 0.05 * (end - start)
        page.goto(f"{server.url}/jobs/{job['id']}?at={first}")
        page.wait_for_function(f"document.getElementById('job-page').dataset.replayed == "
                               f"'{first}'", timeout=120_000)
        page.evaluate(OBSERVE)
        asked.clear()
        steps = max(2, int(args.drag_s / 0.016))
        t0 = time.perf_counter()
        for i in range(steps + 1):
            value = 100 + 800 * i / steps
            page.evaluate("v => { const s = document.getElementById('replay-at'); "
                          "s.value = String(v); s.dispatchEvent(new Event('input')); }",
                          round(value))
            lag = t0 + (i + 1) * 0.016 - time.perf_counter()
            if lag > 0:
                time.sleep(lag)
        moving_s = time.perf_counter() - t0
        # Let go (a mouse release fires change: a page that showed keyframes on the way asks
        # for the exact moment now).
        page.evaluate("() => document.getElementById('replay-at')"
                      ".dispatchEvent(new Event('change'))")
        released = page.evaluate("performance.now()")
        target = start + (end - start) * 900 / 1000
        page.wait_for_function(
            f"Math.abs(Number(document.getElementById('job-page').dataset.replayed) - "
            f"{target}) < 0.01", timeout=120_000)
        shown = page.evaluate("window.__shown")
        during = [t for t, _ in shown if t <= released]
        final = next(t for t, at in reversed(shown) if abs(float(at) - target) < 0.01)
        drag = {"moving_s": moving_s, "shown": len(during), "per_s": len(during) / moving_s,
                "requests": len(asked), "settle_s": max(0.0, (final - released) / 1000)}
        # Play at --speed x from the 10% moment.
        page.evaluate("v => { const s = document.getElementById('replay-at'); "
                      "s.value = '100'; s.dispatchEvent(new Event('input')); }", 0)
        page.wait_for_timeout(3000)
        page.select_option("#replay-speed", str(args.speed))
        page.evaluate(OBSERVE)
        page.click("#replay-play")
        t_play = page.evaluate("performance.now()")
        page.wait_for_timeout(args.play_s * 1000)
        page.click("#replay-play")  # pause
        shown = [(t, float(at)) for t, at in page.evaluate("window.__shown") if at]
        played = [(t, at) for t, at in shown if t >= t_play]
        advanced = played[-1][1] - played[0][1] if len(played) > 1 else 0.0
        play = {"shown": len(played), "per_s": len(played) / args.play_s,
                "kept_up": advanced / (args.speed * args.play_s)}
        return {"drag": drag, "play": play}
    finally:
        page.close()


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=120) as resp:
        return resp.read()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", type=Path, help="a stored job's SQLite file (made when missing)")
    p.add_argument("--ranks", type=int, default=32)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--reference", type=Path, help="another checkout to compare with")
    p.add_argument("--reference-db", type=Path,
                   help="the reference's copy of the job (default: --db), e.g. the same job "
                        "stored by that checkout: a file a newer pgdash migrated is not "
                        "one an older one opens")
    p.add_argument("--drag-s", type=float, default=5.0)
    p.add_argument("--speed", type=int, default=10, choices=(1, 5, 10, 30, 60))
    p.add_argument("--play-s", type=int, default=10)
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="pgdash-scrub-") as tmp:
        work = Path(tmp)
        db = args.db or work / "job.db"
        if not db.exists():
            make_job(db, args.ranks, args.minutes)
        trees = [("this", ROOT, db)] + ([("reference", args.reference.resolve(),
                                          args.reference_db or db)] if args.reference else [])
        rows = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                for label, root, source in trees:
                    copy = work / f"{label}.db"  # scrubs store the checkpoints they pass
                    shutil.copy(source, copy)
                    server = ServerProcess(f"sqlite:///{copy}", root=root,
                                           log_path=work / f"server-{label}.log").start()
                    try:
                        rows.append((label, measure(browser, server, args)))
                    finally:
                        server.stop()
                    print(label, json.dumps(rows[-1][1]), flush=True)
            finally:
                browser.close()
    print(f"\n| pgdash | drag: moments shown / s | state?at= requests | release to the "
          f"moment | play {args.speed}x: moments / s | kept up |")
    print("|---|---|---|---|---|---|")
    for label, r in rows:
        d, pl = r["drag"], r["play"]
        print(f"| {label} | {fmt(d['per_s'], '.1f')} ({d['shown']} in {d['moving_s']:.1f} s) "
              f"| {d['requests']} | {fmt(d['settle_s'])} s | {fmt(pl['per_s'], '.1f')} "
              f"| {pl['kept_up']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
