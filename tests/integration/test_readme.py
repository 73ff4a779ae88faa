"""Every command in the README, run: the README cannot drift from what pgdash does.

Each shell line of the README's ```bash blocks (and its ```python block) must match exactly
one entry of ``RUNNERS``, and each test below runs its entries for real: the demo, the test
command, a server, real gloo jobs under torchrun, ``python -m`` and an emulated ``srun``,
replay, export and import, the installs, a token and TLS, PostgreSQL and Redis. A README line
without a runner fails ``test_every_readme_command_is_run``, so a new command comes with its
test.

What the runs change, and only that: a free loopback port instead of 8686 and ``dash-host``
(servers bind loopback here, ``--host 0.0.0.0`` becomes 127.0.0.1), a fresh database per
test, ``train.py`` is a short 2-rank gloo script (and "nccl" is "gloo": no GPU here), the PostgreSQL and Redis URLs are
throwaway servers', and ``srun`` (no SLURM here) is its four tasks started with the
environment srun gives each task.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import ROOT, free_port, get_json, wait_for
from tests.helpers.realservers import pg_url, postgres_server, redis_url  # noqa: F401  (fixtures)

README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent

# A short training script: DDP on gloo for a few steps, under any launcher (torchrun's RANK,
# SLURM's SLURM_PROCID, or alone as world size 1). Takes --lr as the README's commands pass it.
TRAIN = '''\
import argparse, os
import torch, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", os.environ.get("TEST_MASTER_PORT", "29511"))
dist.init_process_group("gloo", rank=rank, world_size=world)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for _ in range(20):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
dist.destroy_process_group()
os.write(1, f"trained {rank}\\n".encode())  # one write: ranks share the pipe
'''


def readme_blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def readme_commands() -> list[str]:
    """The README's shell lines, comments dropped (a comment starts after two spaces)."""
    lines = []
    for block in readme_blocks("bash"):
        for line in block.splitlines():
            line = re.split(r"\s{2,}#", line)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


# README line (a regular expression, matched whole) -> the test that runs it.
RUNNERS = {
    r"\./tools/demo": "test_demo_commands",
    r"\./tools/demo --scenario hang": "test_demo_commands",
    r"\./tools/test": "test_setup_commands",
    r"source \.venv/bin/activate": "test_setup_commands",
    r"pgdash --help": "test_setup_commands",
    r"pgdash serve": "test_attach_and_after_commands",
    r"torchrun --nproc-per-node 2 -m pgdash_agent train\.py --lr 3e-4":
        "test_attach_and_after_commands",
    r"python -m pgdash_agent train\.py --lr 3e-4": "test_attach_and_after_commands",
    r"python -m pgdash_agent -m my_project\.train --lr 3e-4": "test_attach_and_after_commands",
    r"srun --ntasks-per-node 4 python -m pgdash_agent train\.py":
        "test_attach_and_after_commands",
    r"PGDASH_SERVER=http://dash-host:8686 torchrun --nproc-per-node 8 -m pgdash_agent train\.py":
        "test_attach_and_after_commands",
    r"curl http://127\.0\.0\.1:8686/api/jobs": "test_attach_and_after_commands",
    r"pgdash replay 1": "test_attach_and_after_commands",
    r"pgdash export 1 -o job1\.jsonl": "test_attach_and_after_commands",
    r"pgdash import job1\.jsonl --db sqlite:///elsewhere\.db": "test_attach_and_after_commands",
    r"pgdash replay job1\.jsonl": "test_attach_and_after_commands",
    r"pgdash export 1 --trace -o job1\.json": "test_attach_and_after_commands",
    r"pip install \.": "test_install_commands",
    r"pip install '\.\[agent\]'": "test_install_commands",
    r"pip install '\.\[postgres,redis\]'": "test_install_commands",
    r"export PGDASH_TOKEN=\$\(python -c 'import secrets; print\(secrets\.token_urlsafe\(\)\)'\)":
        "test_token_and_tls_commands",
    r"pgdash serve --host 0\.0\.0\.0 --tls-cert cert\.pem --tls-key key\.pem":
        "test_token_and_tls_commands",
    r"PGDASH_SERVER=https://dash-host:8686 PGDASH_CA_FILE=ca\.pem torchrun --nproc-per-node 8 "
    r"-m pgdash_agent train\.py": "test_token_and_tls_commands",
    r"pgdash serve --db postgresql\+psycopg://pgdash@dbhost/pgdash --queue "
    r"redis://redishost:6379/0": "test_postgres_and_redis_command",
}


def runner_of(command: str) -> list[str]:
    return [test for pattern, test in RUNNERS.items() if re.fullmatch(pattern, command)]


def test_every_readme_command_is_run():
    commands = readme_commands()
    assert len(commands) >= 20, "the README's ```bash blocks were not found"
    unrun = [c for c in commands if len(runner_of(c)) != 1]
    assert not unrun, f"README commands with no (or more than one) runner here: {unrun}"
    stale = [p for p in RUNNERS if not any(re.fullmatch(p, c) for c in commands)]
    assert not stale, f"runners for commands the README no longer has: {stale}"
    assert len(readme_blocks("python")) == 1, "one ```python block: the attach() example"


def test_readme_is_short_and_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(((?:docs/)?[\w.-]+\.(?:md|png))(?:#[\w-]+)?\)", text):
        assert (ROOT / target).exists(), f"README links to missing {target}"
    for doc in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]+)?\)", doc.read_text()):
            assert (ROOT / "docs" / target).exists(), f"{doc.name} links to missing {target}"


def commands_of(test: str) -> list[str]:
    return [c for c in readme_commands() if runner_of(c) == [test]]


def shell(command: str, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (f"README command failed ({done.returncode}): {command}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def user_env(tmp_path: Path, **extra: str) -> dict:
    """A user's shell: the venv's commands first on PATH, a fresh database, no test settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PGDASH_", "PYTEST_", "TORCHELASTIC_", "SLURM_"))}
    env.update(PATH=f"{VENV_BIN}:{env.get('PATH', '')}", PGDASH_DB=f"sqlite:///{tmp_path}/pgdash.db",
               TEST_MASTER_PORT=str(free_port()), **extra)
    return env


class Serve:
    """A README ``pgdash serve ...`` line, on a free port, stopped by PID."""

    def __init__(self, command: str, cwd: Path, env: dict, scheme: str = "http"):
        self.port = free_port()
        command = command.replace("--host 0.0.0.0", "--host 127.0.0.1")
        self.log = cwd / f"serve-{self.port}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", f"exec {command} --port {self.port}"], cwd=cwd, env=env,
                stdout=log, stderr=subprocess.STDOUT)
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        wait_for(lambda: self.proc.poll() is None and f":{self.port}" in self.log.read_text(),
                 60, f"{command!r} to print its address")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text()


def pointed(command: str, port: int) -> str:
    """The README's server address made this test's server."""
    return command.replace("dash-host:8686", f"127.0.0.1:{port}").replace(
        "127.0.0.1:8686", f"127.0.0.1:{port}")


def smaller(command: str) -> str:
    """8 ranks in the README, 2 here (a 2-core machine)."""
    return command.replace("--nproc-per-node 8", "--nproc-per-node 2")


def srun(command: str, cwd: Path, env: dict, timeout: float = 300) -> None:
    """``srun --ntasks-per-node N CMD`` on one node: N tasks with the environment srun sets."""
    words = shlex.split(command)
    assert words[:2] == ["srun", "--ntasks-per-node"]
    tasks, argv = int(words[2]), words[3:]
    procs = []
    for task in range(tasks):
        task_env = {**env, "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
                    "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
                    "SLURM_NTASKS": str(tasks), "SLURM_NODEID": "0"}
        procs.append(subprocess.Popen(argv, cwd=cwd, env=task_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for task, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"srun task {task} of {command!r}:\n{out[-3000:]}"


def jobs(url: str, token: str | None = None, context=None) -> list[dict]:
    return get_json(url + "/api/jobs", token=token, context=context)["jobs"]


def test_setup_commands(tmp_path):
    env = user_env(tmp_path, PGDASH_TEST_WORKERS="0")
    for command in commands_of("test_setup_commands"):
        if command == "./tools/test":
            # The suite itself is what CI runs; here: it sets up and collects.
            out = shell("./tools/test --collect-only -q tests/unit/test_wire.py", ROOT, env)
            assert re.search(r"\d+ tests? collected", out.stdout)
        elif command.startswith("source"):
            out = shell(f"{command} && command -v pgdash", ROOT, env)
            assert out.stdout.strip() == str(ROOT / ".venv" / "bin" / "pgdash")
        else:
            out = shell(f"source .venv/bin/activate && {command}", ROOT, env)
            assert "serve" in out.stdout and "demo" in out.stdout


def test_demo_commands(tmp_path):
    env = user_env(tmp_path)
    for command in commands_of("test_demo_commands"):
        expect = "CRITICAL hang on rank" if "hang" in command else "http://127.0.0.1:"
        log = tmp_path / "demo.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {command} --port 0 --hang-after 20"],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: expect in log.read_text(), 180, f"{command!r} to print {expect!r}")
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        assert proc.returncode == 0, log.read_text()[-3000:]


def test_attach_and_after_commands(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "my_project").mkdir()
    (tmp_path / "my_project" / "__init__.py").write_text("")
    (tmp_path / "my_project" / "train.py").write_text(TRAIN)
    env = user_env(tmp_path)
    commands = commands_of("test_attach_and_after_commands")
    launches = [c for c in commands if c.startswith(("torchrun", "python", "PGDASH_", "srun"))]
    after = [c for c in commands if c.startswith("pgdash ") and c != "pgdash serve"]
    (curl,) = [c for c in commands if c.startswith("curl")]
    assert commands[0] == "pgdash serve" and len(launches) == 5 and len(after) == 5
    server = Serve(commands[0], tmp_path, env)
    try:
        env = {**env, "PGDASH_SERVER": server.url}
        for command in launches:
            if command.startswith("srun"):
                srun(command, tmp_path, env)
            else:
                out = shell(smaller(pointed(command, server.port)), tmp_path, env)
                assert "trained 0" in out.stdout
        # The README's attach() example, inside a 2-rank job of the train.py above.
        (attach,) = readme_blocks("python")
        (tmp_path / "attached.py").write_text(
            "import torch\n" + attach.replace('"nccl"', '"gloo"') + TRAIN.replace(
                'dist.init_process_group("gloo", rank=rank, world_size=world)', ""))
        out = shell("torchrun --nproc-per-node 2 attached.py", tmp_path, env)
        assert "trained 1" in out.stdout
        wait_for(lambda: [j["status"] for j in jobs(server.url)] == ["finished"] * 6, 60,
                 "six finished jobs")
        listed = json.loads(shell(pointed(curl, server.port), tmp_path, env).stdout)["jobs"]
    finally:
        server.stop()
    scripts = [j["name"].split(" ")[0] for j in reversed(listed)]
    assert scripts == ["train.py", "train.py", "my_project.train", "train.py", "train.py",
                       "attached.py"], [j["name"] for j in listed]
    assert [j["world_size"] for j in reversed(listed)] == [2, 1, 1, 4, 2, 2]
    outputs = {c: shell(c, tmp_path, env).stdout for c in after}
    for replay in ("pgdash replay 1", "pgdash replay job1.jsonl"):
        assert outputs[replay].startswith(f"pgdash replay: {listed[-1]['name']}, ")
        assert "job finished with 2 rank(s)" in outputs[replay]
    imported = jobs_in(tmp_path / "elsewhere.db")
    assert len(imported) == 1 and imported[0]["imported_from"].endswith("job1.jsonl")
    trace = json.loads((tmp_path / "job1.json").read_text())
    assert trace["traceEvents"]


def jobs_in(db: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-c",
                          "import json,sys; from dashboard.storage.store import Store; "
                          "s = Store(sys.argv[1]); print(json.dumps(s.jobs.newest()))",
                          f"sqlite:///{db}"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_install_commands(tmp_path):
    """Each ``pip install`` line, into a fresh venv that sees this one's packages (a .pth
    file) and no index: nothing may need downloading beyond what the pinned setup has."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    ours = next(Path(p) for p in sys.path if p.endswith("site-packages") and
                Path(p).is_relative_to(VENV_BIN.parent))
    (next(venv.glob("lib/python*/site-packages")) / "inherit.pth").write_text(f"{ours}\n")
    # PIP_NO_BUILD_ISOLATION=0 turns isolation off (pip reads these switches inverted).
    env = user_env(tmp_path, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_NO_BUILD_ISOLATION="0")
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env.pop("PYTHONPATH", None)  # the installed copy must be the one imported
    for command in commands_of("test_install_commands"):
        shell(f"{command} -q", ROOT, env, timeout=600)
    probe = shell("cd / && python -c 'import pgdash_agent, dashboard; "
                  "print(pgdash_agent.__file__, dashboard.__file__)'", ROOT, env)
    assert probe.stdout.count(str(venv)) == 2, probe.stdout


def test_token_and_tls_commands(tmp_path):
    from tests.helpers.tls import make_cert

    cert, _ = make_cert(tmp_path)
    (tmp_path / "ca.pem").write_bytes(cert.read_bytes())
    (tmp_path / "train.py").write_text(TRAIN)
    export, serve, agents = commands_of("test_token_and_tls_commands")
    token = shell(f"{export} && echo $PGDASH_TOKEN", tmp_path, user_env(tmp_path)).stdout.strip()
    assert len(token) >= 32
    env = user_env(tmp_path, PGDASH_TOKEN=token)
    server = Serve(serve, tmp_path, env, scheme="https")
    try:
        import ssl

        context = ssl.create_default_context(cafile=str(cert))
        out = shell(smaller(pointed(agents, server.port)), tmp_path, env)
        assert "trained 0" in out.stdout
        listed = wait_for(lambda: jobs(server.url, token, context), 30, "the job over https")
        assert listed[0]["name"].startswith("train.py")
        with pytest.raises(OSError):
            jobs(server.url, None, context)  # no token, no jobs
    finally:
        server.stop()


def test_postgres_and_redis_command(tmp_path, pg_url, redis_url):  # noqa: F811
    (command,) = commands_of("test_postgres_and_redis_command")
    command = command.replace("postgresql+psycopg://pgdash@dbhost/pgdash", pg_url).replace(
        "redis://redishost:6379/0", redis_url)
    server = Serve(command, tmp_path, user_env(tmp_path))
    try:
        assert jobs(server.url) == []
    finally:
        console = server.stop()
    assert "queue" in console
