"""The host reader process (pgdash_agent.reader) as its rank's agent starts and stops it: it
leaves nothing behind, whatever the server it meets."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pgdash_agent import reader
from tests.helpers.procs import ROOT, wait_for

AUTH = {"v": 1, "token": "t", "session": "s-reader", "job": "j", "rank": 0, "host": "h",
        "pid": 1}


def test_a_reader_stopped_while_it_retries_is_gone_and_reaped():
    # Nothing listens on port 1: the reader tries again and again, until it is stopped.
    proc = reader.start("http://127.0.0.1:1", AUTH)
    assert proc is not None
    time.sleep(1.5)
    assert proc.poll() is None  # still trying, as while its rank's server restarts
    reader.stop(proc)
    assert proc.returncode is not None  # ended and waited for: no zombie
    reader.stop(proc)  # a second stop is harmless


def test_a_reader_that_meets_an_older_server_ends_by_itself_and_is_reaped():
    """A pgdash that does not know readers answers their path with 404: the reader ends,
    and the agent's reaper collects it without a detach."""

    class Old(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_error(404)

        def log_message(self, *args):
            pass

    old = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Old)
    threading.Thread(target=old.serve_forever, daemon=True).start()
    try:
        proc = reader.start(f"http://127.0.0.1:{old.server_address[1]}", AUTH)
        assert proc is not None
        wait_for(lambda: proc.returncode is not None, 30, "the reader to end and be reaped")
        assert proc.returncode == 0
    finally:
        old.shutdown()
        old.server_close()


def test_a_reader_started_without_its_settings_says_so():
    done = subprocess.run([sys.executable, "-m", "pgdash_agent.reader"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "PGDASH_READER_FOR" in done.stderr, done.stderr


def test_one_process_of_a_host_claims_its_reader_until_it_ends_or_lets_go(tmp_path,
                                                                          monkeypatch):
    """Where the launcher does not say which rank is first on its host (mp.spawn), the
    first to claim starts the reader: never two, and a claim ends with its process."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # (the claim's directory: gettempdir())
    monkeypatch.setattr(tempfile, "tempdir", None)

    def other(key: str) -> bool:
        """Whether another process of this user gets the claim."""
        code = f"from pgdash_agent import reader; print(reader.claim({key!r}) is not None)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return done.stdout.strip() == "True"

    held = []  # released whatever fails
    try:
        held.append(reader.claim("job-a"))
        assert held[0] is not None and Path(held[0][1]).parent.parent == tmp_path
        assert reader.claim("job-a") is None  # (a second claim in this process: refused too)
        assert not other("job-a")
        assert other("job-b")  # another launch has a claim of its own
        # The process that held job-b ended without letting go: the kernel let go for it.
        assert other("job-b")
        reader.release(held.pop())
        assert other("job-a")
        # A claim a killed rank left behind is swept by the next claim once a minute old;
        # one held, or younger (a launch claiming right now), is not.
        left = reader.claim("job-d")
        os.close(left[0])  # as the kernel does for a killed rank: the lock goes, the file stays
        young = reader.claim("job-e")
        os.close(young[0])
        held.append(reader.claim("job-f"))
        for path in (left[1], held[-1][1]):
            os.utime(path, (time.time() - 120, time.time() - 120))
        held.append(reader.claim("job-g"))
        assert not Path(left[1]).exists()
        assert Path(young[1]).exists() and Path(held[-2][1]).exists()
        assert not other("job-f")  # still held: never swept
    finally:
        for claimed in held:
            reader.release(claimed)


def test_a_claim_whose_file_went_before_it_was_locked_is_no_claim(tmp_path):
    """Opened just before its holder released it (or a sweep took it), then locked: that
    file is gone, and the lock on it must not count, or a later rank claims beside it."""
    name = tmp_path / "reader-x.lock"
    gone = os.open(name, os.O_RDWR | os.O_CREAT)
    name.unlink()
    name.touch()  # the next claimant's
    try:
        assert not reader._still_at(gone, name)
    finally:
        os.close(gone)
    fd = reader._lock(name)
    try:
        assert fd is not None and reader._still_at(fd, name)
    finally:
        os.close(fd)


def test_a_claim_in_a_directory_not_this_users_alone_is_refused(tmp_path, monkeypatch):
    """A link, or a directory others may write to: no claim, so no reader."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    mine = tmp_path / f"pgdash-{os.getuid()}"
    mine.symlink_to(tmp_path)
    assert reader.claim("job-c") is None
    mine.unlink()
    mine.mkdir(mode=0o700)
    mine.chmod(0o777)
    assert reader.claim("job-c") is None
    mine.chmod(0o700)
    held = reader.claim("job-c")
    assert held is not None
    reader.release(held)
