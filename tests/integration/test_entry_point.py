"""``pgdash_agent``, the name a project's own ``agent`` module cannot shadow, and the guard
that makes the old name ``agent`` say so instead of running the wrong module.

A project with an ``agent.py`` of its own is common (RL agents, LLM agents). Python finds it
before pgdash's ``agent`` whenever the working directory or the script's directory comes first
on ``sys.path``, which is always so for ``-m`` and for scripts.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.procs import free_port

USERS_AGENT = """\
import pathlib
pathlib.Path("users-agent-ran").write_text("yes")
def act():
    return "my own agent"
"""

# The user's training script imports their own agent module, as such projects do.
TRAIN = """\
import os, sys
import torch.distributed as dist
import agent
assert agent.act() == "my own agent", agent
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1],
                         rank=int(os.environ.get("RANK", 0)),
                         world_size=int(os.environ.get("WORLD_SIZE", 1)))
import pgdash_agent
assert pgdash_agent.current() is not None, "the agent attached"
dist.barrier()
dist.destroy_process_group()
print("trained")
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "agent.py").write_text(USERS_AGENT)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def run(args, cwd, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PGDASH_")}
    # An unreachable server: the agent retries in the background, training goes on.
    clean.update(PGDASH_SERVER=f"http://127.0.0.1:{free_port()}", **env)
    return subprocess.run(args, cwd=cwd, env=clean, capture_output=True, text=True,
                          timeout=120)


def test_dash_m_agent_with_a_users_agent_module_runs_nothing_and_says_why(project):
    done = run([sys.executable, "-m", "agent", "train.py", str(free_port())], project)
    assert done.returncode == 2
    assert "pgdash: nothing was run" in done.stderr
    assert str(project / "agent.py") in done.stderr and "-m pgdash_agent" in done.stderr
    assert not (project / "users-agent-ran").exists(), "the user's module must not run"


def test_torchrun_dash_m_agent_is_stopped_the_same_way(project):
    done = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                "-m", "agent", "train.py", str(free_port())], project)
    assert done.returncode != 0
    assert "pgdash: nothing was run" in done.stderr + done.stdout
    assert not (project / "users-agent-ran").exists()


def test_dash_m_pgdash_agent_runs_beside_the_users_agent_module(project):
    """The training script imports its own ``agent`` and gets it; pgdash attaches anyway."""
    done = run([sys.executable, "-m", "pgdash_agent", "train.py", str(free_port())], project)
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    assert (project / "users-agent-ran").exists()


def test_from_agent_import_attach_names_the_users_file(project):
    done = run([sys.executable, "-c", "from agent import attach"], project)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cannot import name 'attach' from 'agent' (")
    assert str(project / "agent.py") in last and "from pgdash_agent import attach" in last


def test_the_users_own_agent_module_is_untouched(project):
    """Its own names import, a missing one is Python's usual error, and ``python -m agent``
    without a script (the user's own entry point) runs their module."""
    done = run([sys.executable, "-c", "from agent import act; print(act())"], project)
    assert done.stdout.strip() == "my own agent", done.stderr
    missing = run([sys.executable, "-c", "import agent; agent.nope"], project)
    assert "AttributeError: module 'agent' has no attribute 'nope'" in missing.stderr
    (project / "users-agent-ran").unlink()
    own = run([sys.executable, "-m", "agent", "--episodes", "3"], project)
    assert own.returncode == 0 and (project / "users-agent-ran").exists()


def test_the_guard_can_be_turned_off(project):
    done = run([sys.executable, "-m", "agent", "train.py", "1"], project, PGDASH_GUARD="0")
    assert (project / "users-agent-ran").exists(), done.stderr


def test_without_a_users_module_agent_is_pgdash(tmp_path):
    done = run([sys.executable, "-c", "import agent, pgdash_agent; "
                "print(agent.attach is pgdash_agent.attach)"], tmp_path)
    assert done.stdout.strip() == "True", done.stderr
