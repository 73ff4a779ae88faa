"""Diagnosis texts shared by the rules: how ranks, groups, processes and code locations are
named, verbs that agree with the ranks they follow, and the next steps that depend on the
job's backend and on the tools its hosts have (``py-spy``)."""

from __future__ import annotations

import os
from typing import Any, Iterable

from dashboard.state import JobState, RankState

MAX_LISTED = 12  # rank numbers (or ranges) written out; the rest are counted


def _spans(ranks: list[int]) -> list[str]:
    """"0-3", "5", "7, 8" (runs of three or more as a range)."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{ranks[i]}-{ranks[j]}")
        else:
            out.extend(str(r) for r in ranks[i:j + 1])
        i = j + 1
    return out


def ranks_label(ranks: Iterable[int]) -> str:
    """"rank 3", "ranks 0, 1", "ranks 0-7, 9", "ranks 0, 2, 4 and 500 more"."""
    ranks = sorted(set(ranks))
    spans = _spans(ranks)
    text = ", ".join(spans[:MAX_LISTED])
    if len(spans) > MAX_LISTED:
        text += f" and {len(spans) - MAX_LISTED} more"
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def agree(ranks: Iterable[Any], singular: str, plural: str) -> str:
    """The verb (or pronoun) for these ranks: ``singular`` for one, ``plural`` for more."""
    return singular if len(set(ranks)) == 1 else plural


def have(ranks: Iterable[int]) -> str:
    return agree(ranks, "has", "have")


def them(ranks: Iterable[int]) -> str:
    return agree(ranks, "it", "them")


def join_and(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def sentence(text: str) -> str:
    """``text`` ended by one full stop (an error message may bring its own)."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def group_label(state: JobState, name: str) -> str:
    desc = (state.groups.get(name) or {}).get("desc")
    # torch names groups made without a description "undefined"
    return f"group {name} ({desc})" if desc and desc != "undefined" else f"group {name}"


def process_label(r: RankState | None) -> str:
    if r is None:
        return ""
    return f" (pid {r.pid} on {r.host})" if r.pid else ""


# -- code locations (an exception's traceback, agent.frames) -----------------------------------

def frame_label(frame: dict[str, Any]) -> str:
    """"train.py:42 in step()", or "train.py:42" at a module's top level."""
    where = f"{os.path.basename(str(frame.get('file') or '?'))}:{frame.get('line') or '?'}"
    function = frame.get("function")
    return where if not function or function == "<module>" else f"{where} in {function}()"


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The training code's own frame among ``frames`` (outermost first): the innermost that
    is not the standard library's or an installed package's, else the innermost."""
    return next((f for f in reversed(frames) if not f.get("library")),
                frames[-1] if frames else None)


def stack_text(frames: list[dict[str, Any]]) -> str:
    """Frames as Python prints a stack (outermost first), each with its source line."""
    lines = []
    for f in frames:
        lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["function"]}\n')
        if f.get("code"):
            lines.append(f"    {f['code']}\n")
    return "".join(lines)


# -- the backend of a group, and what ends a wait on it ---------------------------------------

def backend_of(state: JobState, group: str | None = None) -> str | None:
    """"nccl", "gloo", another backend's name, or None when no rank said."""
    names = [(state.groups.get(group) or {}).get("backend")] if group is not None else []
    names += [r.backend for r in state.ranks()]
    for name in filter(None, names):
        name = str(name).lower()
        # "cpu:gloo,cuda:nccl" (init_process_group() without a backend, on GPUs): the
        # training's collectives are the CUDA tensors', NCCL's
        return "nccl" if "nccl" in name else "gloo" if "gloo" in name else name
    return None


def pg_timeout_s(state: JobState) -> float | None:
    """The timeout the job passed to init_process_group, when the agent saw it."""
    return next((e["timeout_s"] for e in state.init.values() if e.get("timeout_s")), None)


def what_ends_the_wait(state: JobState, group: str | None) -> str:
    """One sentence: what would end this wait without anyone acting, on this backend."""
    backend = backend_of(state, group)
    timeout = pg_timeout_s(state)
    if backend == "nccl":
        return ("Without pgdash the NCCL watchdog would report this only after its timeout "
                f"({f'{timeout:g} s in this job' if timeout else '10 minutes by default'}); "
                "TORCH_NCCL_DUMP_ON_TIMEOUT=1 keeps a Flight Recorder dump then.")
    limit = (f", {timeout:g} s in this job" if timeout
             else ", 30 minutes by default" if backend == "gloo" else "")
    on = "On gloo nothing" if backend == "gloo" else "Nothing"
    return (f"{on} ends this wait until the process group's timeout runs out "
            f"(`init_process_group(timeout=...)`{limit}); then the waiting ranks fail with a "
            "timeout of their own, a consequence of this one.")


# -- how to see where a rank is ---------------------------------------------------------------

def py_spy_path(r: RankState | None) -> str | None:
    """Where the rank's agent found py-spy; None if absent or not reported (older agents)."""
    return ((r.versions or {}).get("py-spy") or None) if r is not None else None


def stack_commands(state: JobState, ranks: Iterable[int], limit: int = 3) -> str:
    """The commands that show where these ranks' Python code is now: py-spy where the agent
    found it, else how to install it first."""
    index = state.rank_index()
    ranks = sorted(set(ranks))
    commands, missing = [], 0
    for rank in ranks[:limit]:
        r = index.get(rank)
        tool = py_spy_path(r)
        missing += tool is None
        pid = r.pid if r is not None and r.pid else "<its pid>"
        host = f" on {r.host}" if r is not None and r.host else ""
        commands.append(f"`{tool or 'py-spy'} dump --pid {pid}`{host}")
    text = join_and(commands)
    if len(ranks) > limit:
        text += f" (and the same for the other {len(ranks) - limit})"
    if missing:
        where = "" if missing == len(commands) else " where it is missing"
        text = f"`pip install py-spy`{where}, then {text}"
    return text
