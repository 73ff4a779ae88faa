"""A wheel built from the repo, installed non-editable in a fresh venv outside the repo (no
torch: a dashboard-only host), serves the page and a vendored file and migrates a database."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.procs import ROOT, free_port, get_body, wait_for


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_wheel_installs_serves_and_migrates(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(ROOT)])
    wheel = next(dist.glob("pgdash-*.whl"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    pip = venv / "bin" / "pip"
    run([str(pip), "install", "-q", str(wheel)])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGDASH_DB")}
    python = venv / "bin" / "python"
    probe = run([str(python), "-c", "import importlib.util as u, dashboard, agent, pgdash_agent; "
                 "print(dashboard.__file__); print(u.find_spec('torch') is None)"],
                cwd=outside, env=env).stdout.split()
    assert str(venv) in probe[0], "the installed package must be used, not the checkout"
    assert probe[1] == "True", "a dashboard-only install must not pull torch"

    # The wheel carries pgdash_agent and the guard that names a project's own `agent` module.
    (outside / "agent.py").write_text("raise SystemExit('the project module ran')\n")
    (outside / "train.py").write_text("")
    shadowed = subprocess.run([str(python), "-m", "agent", "train.py"], cwd=outside, env=env,
                              capture_output=True, text=True, timeout=120)
    assert shadowed.returncode == 2 and "-m pgdash_agent" in shadowed.stderr, shadowed.stderr
    (outside / "agent.py").unlink()

    db = outside / "fresh.db"
    out = run([str(venv / "bin" / "pgdash"), "db", "upgrade", "--db", f"sqlite:///{db}"],
              cwd=outside, env=env)
    assert "is up to date" in out.stdout and db.stat().st_size > 0

    port = free_port()
    server = subprocess.Popen([str(venv / "bin" / "pgdash"), "serve", "--port", str(port)],
                              cwd=outside, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        page = wait_for(lambda: get_body(base + "/", timeout=5), 60,
                        "the installed server")
        assert b"pgdash" in page
        vendored = get_body(base + "/static/vendor/socket.io-4.8.4.min.js", timeout=30)
        assert len(vendored) > 20_000
        assert (outside / "pgdash.db").exists(), "serve migrates its default database"
    finally:
        server.terminate()
        server.wait(timeout=10)
