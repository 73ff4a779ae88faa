"""Take the README's screenshots of `pgdash demo` scenarios into docs/ (headless Chromium).

Each shot runs the real demo (server + gloo ranks on CPU) on a free port and a scratch
database, waits for its finding, and captures the job page at 1400 px wide. Run from the
repository root with the venv of ./tools/demo or ./tools/test:

    .venv/bin/python tools/screenshots.py             # every shot
    .venv/bin/python tools/screenshots.py hang crash  # some
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"

def snapshot_all(page):
    """Ask every rank for a snapshot from the Snapshots card; its answers are the shot."""
    page.click("#snapshot-all")
    page.wait_for_selector("#snapshot-view[data-complete='1']", timeout=30_000)
    page.click("#snapshot-view .snapshot-rank summary")  # one rank's threads, opened
    time.sleep(1)
    return page.locator("#snapshots-card")


# name -> (scenario, ranks, seconds to let it run after its fault, topology view, full page,
#          what to do before the shot: returns the element to shoot, or None for the page)
SHOTS = {
    "demo-hang": ("hang", 4, 25, None, False, None),
    "demo-hang-full": ("hang", 4, 25, None, True, None),
    "demo-healthy": ("healthy", 4, 20, "mesh", False, None),
    "demo-straggler": ("straggler", 4, 30, None, False, None),
    "demo-crash": ("crash", 4, 12, None, False, None),
    "demo-desync": ("desync", 4, 15, None, False, None),
    "demo-snapshots": ("hang", 4, 25, None, False, snapshot_all),
}


def shoot(name: str, scenario: str, ranks: int, seconds: float, view: str | None,
          full: bool, prepare, browser) -> None:
    db = Path(tempfile.mkdtemp()) / "shots.db"
    demo = subprocess.Popen(
        [sys.executable, "-m", "dashboard", "demo", "--scenario", scenario, "--ranks",
         str(ranks), "--port", "0", "--db", f"sqlite:///{db}", "--hang-after", "10"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line and demo.poll() is not None:
                raise SystemExit(f"{name}: the demo ended before printing its URL")
            match = re.search(r"(http://127\.0\.0\.1:\d+/jobs/\d+)", line)
            url = match.group(1) if match else None
        if url is None:
            raise SystemExit(f"{name}: no job URL from the demo within 90 s")
        page = browser.new_page(viewport={"width": 1400, "height": 1150})
        page.goto(url)
        page.wait_for_selector("[data-rendered='1']", timeout=60_000)
        time.sleep(seconds)
        if view:
            page.select_option("#topology-view", view)
            time.sleep(1)
        element = prepare(page) if prepare is not None else None
        if element is not None:  # the sticky header would cover part of it
            page.add_style_tag(content="header { position: static !important; }")
            element.screenshot(path=str(DOCS / f"{name}.png"))
        else:
            page.screenshot(path=str(DOCS / f"{name}.png"), full_page=full)
        page.close()
        print(f"{name}: {url} -> docs/{name}.png", flush=True)
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(30)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shots", nargs="*", help=f"which of {', '.join(SHOTS)} (default: all)")
    args = parser.parse_args()
    unknown = [name for name in args.shots if name not in SHOTS]
    if unknown:
        parser.error(f"no shot named {', '.join(unknown)}; choose from {', '.join(SHOTS)}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for name in args.shots or SHOTS:
                shoot(name, *SHOTS[name], browser)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
