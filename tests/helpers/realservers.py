"""Real PostgreSQL and Redis servers for tests: started on loopback, free port, temp dir, by PID.

No system service is used or needed: ``initdb`` + ``postgres`` (Debian's ``postgresql``
package, binaries under /usr/lib/postgresql/<version>/bin) and ``redis-server`` run as child
processes of the test run, each in its own temporary directory, and are stopped by their PID.

PostgreSQL refuses to run as root, and CI runs tests as root: then the cluster runs as the
``postgres`` system user (Debian's package creates it), or as a ``pgdash-test`` system user
created on first use. Without the binaries a test skips with the reason, unless we are root
(then ``tools/test`` should have installed them, and their absence is an error to fix).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.procs import free_port

PG_USER_CANDIDATES = ("postgres", "pgdash-test")
INSTALL_HINT = ("install Debian's postgresql and redis-server packages "
                "(tools/test does it when run as root)")


def _missing(what: str) -> None:
    """Skip (not root: we may not install) or fail (root: tools/test should have)."""
    message = f"{what} not found; {INSTALL_HINT}"
    if os.geteuid() == 0:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def postgres_bin() -> Path | None:
    """The folder holding ``initdb`` and ``postgres`` (PGDASH_TEST_PG_BIN overrides)."""
    override = os.environ.get("PGDASH_TEST_PG_BIN")
    if override:
        return Path(override)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                      key=lambda p: int(Path(p).parent.parent.name)
                      if Path(p).parent.parent.name.isdigit() else 0)
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _run_as() -> str | None:
    """The unprivileged user PostgreSQL runs as when we are root (created if none exists)."""
    if os.geteuid() != 0:
        return None
    for name in PG_USER_CANDIDATES:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", "pgdash-test"], capture_output=True, text=True)
    try:  # another test worker (tools/test runs two) may have made it first
        pwd.getpwnam("pgdash-test")
    except KeyError:
        raise RuntimeError(f"cannot create the pgdash-test user: {made.stderr}") from None
    return "pgdash-test"


class PostgresServer:
    """A throwaway PostgreSQL cluster: ``initdb`` in a temp dir, ``postgres`` on a free port.

    Trust authentication on 127.0.0.1 only, no Unix socket, fsync off: a test database, not
    a durable one.
    """

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.user = _run_as()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgdash-pg-"))
        self.data = self.dir / "data"
        self.proc: subprocess.Popen | None = None
        self._databases = 0

    def _popen_kw(self) -> dict:
        if self.user is None:
            return {}
        entry = pwd.getpwnam(self.user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def start(self) -> "PostgresServer":
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        log = open(self.dir / "postgres.log", "ab")
        try:
            subprocess.run([str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "pgdash",
                            "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
                           stdout=log, stderr=subprocess.STDOUT, check=True, cwd=self.dir,
                           **self._popen_kw())
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", "", "-c", "fsync=off", "-c", "max_connections=200",
                 "-c", "full_page_writes=off"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, **self._popen_kw())
        finally:
            log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: "
                                   f"{(self.dir / 'postgres.log').read_text()[-2000:]}")
            try:
                self._admin("SELECT 1")
                return self
            except Exception:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("postgres did not accept connections within 60 s")

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="pgdash",
                             dbname="postgres", autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://pgdash@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        self._databases += 1
        name = f"test{self._databases}"
        self._admin(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: no waiting for clients
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer:
    """A throwaway ``redis-server`` on a free loopback port, nothing persisted."""

    def __init__(self, binary: str):
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgdash-redis-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        with open(self.dir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: "
                                   f"{(self.dir / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("redis-server did not answer PING within 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL cluster for the test session (each test takes a fresh database)."""
    bin_dir = postgres_bin()
    if bin_dir is None or not (bin_dir / "postgres").exists():
        _missing("PostgreSQL (initdb, postgres)")
    srv = PostgresServer(bin_dir).start()
    yield srv
    srv.stop()


@pytest.fixture
def pg_url(postgres_server):
    """A fresh, empty PostgreSQL database on the session's cluster."""
    return postgres_server.new_database()


@pytest.fixture
def redis_url():
    """A fresh redis-server for one test."""
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server")
    srv = RedisServer(binary).start()
    yield srv.url
    srv.stop()
