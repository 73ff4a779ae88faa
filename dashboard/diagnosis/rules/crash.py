"""Rules for ranks that died: a rank lost (killed, vanished) and a rank that failed with an error."""

from __future__ import annotations

import bisect
import collections
import re
from typing import Any

from pgdash_agent.native import gil_holder, where_blocked

from dashboard.diagnosis.errors import classify_error
from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import (agree, backend_of, frame_label, process_label,
                                      ranks_label, sentence, stack_commands, user_frame)
from dashboard.diagnosis.rules.departures import (INTERRUPT_BEFORE_S, departures, ends,
                                                   interrupted_at, is_init_failure)
from dashboard.diagnosis.rules.hangs import job_stop
from dashboard.state import JobState, RankState

# A rank lost this long after another rank crashed or was lost was ended because of it: torchrun
# notices a dead worker within its --monitor-interval (0.1 s) and terminates the others; a
# scheduler kills the whole job. Ranks killed together (within this) are each named.
CONSEQUENCE_AFTER_S = 0.01


# Ranks of one host whose connections closed (no goodbye) this close together went with
# their host (rank_lost names them in one finding). In effect the ranks killed within
# CONSEQUENCE_AFTER_S of each other: one lost later is read as the first one's consequence.
LOST_TOGETHER_S = 1.0

# DDP's model check is raised by every rank: a tie of the first reports waits this long for
# the rest to outvote it (they come within milliseconds of each other unless a rank died).
DDP_VOTE_WAIT_S = 2.0
# Ranks that failed this close together with different errors, or only on a peer's end, wait
# TOGETHER_WAIT_S for a peer that still runs to report what ended them (_together_pending).
FAILED_TOGETHER_S = 0.1
TOGETHER_WAIT_S = 1.0

# Ranks of one host whose heartbeats stopped this close together (connections open), none
# read from outside, went silent with their host: a heartbeat a second, so one period apart.
SILENT_TOGETHER_S = 2.0

# Every rank of a job vanishing within this of each other, none with an error, and no rank
# first alone, is the job stopped from outside (a scheduler's SIGTERM reaches every rank at
# once: 0, 0.1 and 11.6 ms on a loaded 2-core machine; 0, 15 and 27.5 ms with a host reader
# stopped beside them), not a rank's fault. A launcher that stops the others when it sees a
# rank die does so after it saw it: the first death stands alone before the others' burst
# (mp.spawn's parent: 0, then 17.8 and 19.7 ms; torchrun, up to its --monitor-interval, 0.1 s,
# later).
STOPPED_TOGETHER_S = 0.05
# A first death stands alone when the next comes at least this long after it, and more than
# twice as long after it as the rest take among themselves: three ranks that died 0.5 then
# 0.4 ms apart (scancel), or 15 then 12.5 ms apart (the same beside a CPU hog), are one burst,
# however the kernel spaced them inside it; mp.spawn's 17.8 then 1.9 ms is a death and the
# launcher's reaction.
ALONE_BEFORE_S = 0.005


# How a rank's process ended, where its host's reader saw it end (RankState.ended): the signals
# a scheduler or launcher stops a job with (scancel, a preemption or time limit, Kubernetes,
# torchrun's teardown, Ctrl-C to a launcher), and what each signal says of the process.
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
ENDED_HINTS = {
    "SIGKILL": "SIGKILL comes from the OOM killer (`dmesg -T | grep -iE 'killed process|out of "
               "memory'` on {host}), a scheduler's kill after its grace period, or `kill -9`",
    "SIGABRT": "SIGABRT is a C++ abort: gloo's \"Received data size doesn't match expected "
               "size\" or a `gloo::EnforceNotMet` in that rank's log means ranks passed one "
               "collective tensors of different sizes (gloo aborts the rank that received the "
               "odd message, not always the one that sent it: compare the shapes every rank "
               "passes to that collective); NCCL's watchdog aborts a rank whose collective "
               "timed out",
    "SIGSEGV": "SIGSEGV is a crash in native code (a C extension, a CUDA library, a driver): "
               "run it with `PYTHONFAULTHANDLER=1` to print the Python stack at the crash, and "
               "look for a core dump (`coredumpctl list` on {host})",
    "stop": "{signal} is a stop from outside: a scheduler that cancelled or preempted it "
            "(`sacct -j <job>`, `kubectl describe pod`), a launcher, or `kill`",
}
ENDED_HINTS.update(dict.fromkeys(("SIGBUS", "SIGILL", "SIGFPE"), ENDED_HINTS["SIGSEGV"]))


def ended_label(ended: dict[str, Any] | None) -> str | None:
    """``SIGKILL`` or ``exit status 1``; None where nobody saw how the process ended (or only
    that it was not by SIGTERM)."""
    if not ended or ended.get("not_sigterm"):
        return None
    return ended.get("signal") or f"exit status {ended.get('code')}"


def told_to_stop(ended: dict[str, Any] | None) -> bool | None:
    """Whether a process ended by a stop signal (True), on its own (False: a crash signal or an
    exit status), or as nobody can say (None: not seen; SIGKILL, which both a scheduler's stop
    and the OOM killer send; or only not by SIGTERM)."""
    if not ended or ended.get("not_sigterm") or ended.get("signal") == "SIGKILL":
        return None
    return ended.get("signal") in STOP_SIGNALS


def ended_hint(r: RankState) -> str:
    """What the signal or exit status a rank's process ended by says, as a sentence; "" when
    not known."""
    label = ended_label(r.ended)
    if label is None:
        return ""
    signal = r.ended.get("signal")
    text = ENDED_HINTS.get("stop" if signal in STOP_SIGNALS else signal or "", "")
    if not text and signal is None:
        text = (f"it exited with status {r.ended.get('code')} without its agent's exit report "
                "(`os._exit`, a C library's `exit()`): the end of its own log says why")
    elif not text:
        text = f"{signal} was sent to it (`kill -l`), or raised by the process itself"
    return (f"Its host's reader saw process {r.pid} end by {label}: "
            + text.format(host=r.host or "its host", signal=signal) + ". ")


# Exceptions of torch.distributed and its launcher: never a plain bug of the training code.
DISTRIBUTED_ERRORS = frozenset({
    "DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "QueueEmptyError",
    "ChildFailedError", "RendezvousError", "RendezvousTimeoutError", "RendezvousClosedError",
    "NCCLError", "ProcessRaisedException", "ProcessExitedException"})
# Python's own exceptions that only the program's code raises: a bug of the training code
# (or of the data it read) even without a traceback (older agents send none).
PLAIN_ERRORS = frozenset({
    "ZeroDivisionError", "ArithmeticError", "FloatingPointError", "OverflowError",
    "IndexError", "KeyError", "LookupError", "TypeError", "ValueError", "AttributeError",
    "NameError", "UnboundLocalError", "AssertionError", "NotImplementedError",
    "RecursionError", "ImportError", "ModuleNotFoundError", "FileNotFoundError",
    "IsADirectoryError", "NotADirectoryError", "StopIteration", "UnicodeDecodeError",
    "UnicodeEncodeError", "SyntaxError", "IndentationError"})


def _distributed_file(path: str) -> bool:
    path = path.replace("\\", "/")
    return "/torch/distributed/" in path or path.endswith("/torch/nn/parallel/distributed.py")


def code_bug(err: dict[str, Any] | None, cause: Any) -> dict[str, Any] | None:
    """Where an error that ended a rank is a bug of the training code rather than a
    distributed fault: the frame of the training code's line that raised it (the innermost
    frame that is no library's), ``{}`` when the agent sent no traceback; None when the error
    is distributed, known, or not an exception of the program."""
    if err is None or cause is None or cause.cause != "unknown" or \
            err.get("where") != "uncaught":
        return None
    error_type = err.get("error_type") or ""
    if error_type in DISTRIBUTED_ERRORS:
        return None
    frames = err.get("traceback") or []
    if not frames:
        return {} if error_type in PLAIN_ERRORS else None
    if _distributed_file(str(frames[-1].get("file") or "")):
        return None  # raised inside torch.distributed: a collective's error no rule knows
    return user_frame(frames)


def _consequence(state: JobState, r: RankState, s: Settings) -> bool:
    """Whether a rank ended because something else ended it first: a hung job being stopped
    (rules.hangs.job_stop), a peer that left early (rules.departures), someone who
    interrupted the job, or a peer's crash or loss just before (see CONSEQUENCE_AFTER_S)."""
    stop = job_stop(state, s)
    if stop is not None and r.rank in stop.ranks:
        return True
    for d in departures(state):
        if r.rank in d.victims or (r.exit_at is not None and r.exit_at >= d.at):
            return True
    stopped = interrupted_at(state)
    if stopped is not None and (r.exit_at or r.last_seen or 0) >= stopped - INTERRUPT_BEFORE_S:
        return True  # someone stopped the job: a rank killed or cut off on its way out
    if r.status != RankStatus.LOST or r.exit_at is None:
        return False
    if told_to_stop(r.ended):  # SIGTERMed after a peer ended otherwise: the launcher's stop
        index = state.rank_index()
        if any(rank != r.rank and t <= r.exit_at and told_to_stop(index[rank].ended) is not True
               for t, rank in ends(state) if rank in index):
            return True
    first = next(((t, rank) for t, rank in ends(state) if rank != r.rank), None)
    if first is None or r.exit_at < first[0] + CONSEQUENCE_AFTER_S:
        return False
    return not _died_with(state, r, first[1])


def _died_with(state: JobState, r: RankState, other: int) -> bool:
    """Whether ``r``, lost after ``other`` was, went with it rather than because of it: both
    killed on one host, in a job whose processes no launcher watches (started by hand or by
    a scheduler's per-process command: no torchrun, mp.spawn or srun to stop the rest when
    one dies). Two processes killed at once (a node's power, the OOM killer taking a
    host's ranks) end milliseconds apart on a crowded host; only a launcher's reaction
    makes the later one a consequence."""
    first = state.rank_index().get(other)
    if first is None or first.status != RankStatus.LOST or not r.host or first.host != r.host:
        return False
    if r.exit_at - (first.exit_at or 0.0) > LOST_TOGETHER_S:
        return False
    return all(x.launcher == "python" for x in state.ranks())


def _running_seen(state: JobState) -> list[float]:
    """The newest report times of the running ranks, sorted (remembered per state)."""
    return state.memo(("running_seen",), lambda: sorted(
        r.last_seen for r in state.ranks()
        if r.status in (RankStatus.RUNNING, RankStatus.INITIALIZING)))


def _heard_until(state: JobState, but: RankState | None = None) -> float:
    """How far the server has read the running ranks (but ``but``): the median time of their
    newest reports; infinity when no other runs.

    A server behind its agents reads every rank late, and a rank that reconnected after an
    ack timeout, or whose reports wait in the backlog, later than the others: judged on the
    clock alone, such a rank was taken for lost (a healthy 1,024-rank job got rank_lost
    criticals). Judged against the others' reports, a rank is lost only when the server read
    them past it, by the reconnect grace or ``lost_after`` (rank_lost falls back to the
    clock when most running ranks are silent).
    """
    seen = _running_seen(state)
    if but is not None and but.status in (RankStatus.RUNNING, RankStatus.INITIALIZING):
        if len(seen) <= 1:
            return float("inf")  # nobody else: the clock alone says
        mine = bisect.bisect_left(seen, but.last_seen)
        middle = (len(seen) - 1) // 2  # the median of the others: one report fewer
        return seen[middle + 1] if mine <= middle else seen[middle]
    return seen[len(seen) // 2] if seen else float("inf")


def _connection_alive(r: RankState, since: float, now: float, s: Settings) -> bool:
    """Whether the live server heard from ``r``'s agent within ``lost_after`` of ``now``, on its
    connection (a frame, or an acknowledgement it still owed), and after ``since`` for a rank
    whose connection closed (it came back): then the fold is only behind, and the rank is not
    lost (dashboard.ingest.heard)."""
    if s.heard is None:
        return False
    heard = s.heard(r.session, now)
    if heard is None:
        return False
    return now - heard <= s.lost_after and (r.status != RankStatus.LOST or heard > since)


def rank_lost(state: JobState, now: float, s: Settings) -> list[Finding]:
    whole = _job_stopped(state, now, s)
    if whole is _PENDING:
        return []  # (each lost rank would be named the moment its own grace ran out)
    return [whole] if whole is not None else _together(state, _lost_each(state, now, s))


# _job_stopped: the job reads as stopped once the last death's grace has run out
_PENDING: Any = object()


def _job_stopped(state: JobState, now: float, s: Settings) -> Finding | None | Any:
    """Every rank of the job vanished within STOPPED_TOGETHER_S, none with an error or an exit of
    its own, and no hang stood: the job was ended from outside (``scancel``, a preemption, the
    allocation's time limit, a signal to the launcher's process group), or its only host went
    down. Not a rank's fault: one finding for information, never a culprit. A rank killed by
    the kernel (the OOM killer) ends first and alone: its peers' collectives fail on its
    closed connection, or the launcher stops them, all at once, after it saw the death.
    _PENDING while it would read so once the last death's reconnect grace has run out (until
    then the ranks that died first are named by nobody: healthy_scancel's rank 0 was lost for
    half a second, a judgement between its grace and the last one's)."""
    ranks = state.ranks()
    if len(ranks) < max(3, state.world_size or 0):  # (fewer: no burst to tell a lone first by)
        return None
    lost = [r for r in ranks if r.status == RankStatus.LOST]
    if not lost or any(r.exit_at is None or r.closed_goodbye
                       or r.closed_owed_s >= s.owed_close_after for r in lost):
        return None
    told_any = {r.rank: told_to_stop(r.ended) for r in ranks}
    told = {r.rank: told_any[r.rank] for r in lost}
    if False in told.values():
        return None  # a rank's reader saw it crash or exit on its own
    signalled = all(told.values())
    gone = sorted(r.exit_at for r in lost)  # (not ``ends``: departures' function)
    first, last = gone[0], gone[-1]
    # Where every lost rank's reader saw it stopped, the others may have failed on their
    # closed connections before their own SIGTERM came (a scheduler signals one process
    # after another): consequences, not errors of their own.
    # A rank SIGTERMed alone (``kill``), whose peers failed without being stopped themselves,
    # is a rank lost: two processes at least must have been seen stopped; and a host stopped
    # whole (a node preempted) whose peers on other hosts failed on it is a host lost: each
    # host must have had a rank seen stopped.
    waited = [r for r in ranks if r.status != RankStatus.LOST]
    stopped_hosts = {r.host for r in ranks if told_any[r.rank]}
    if waited and not (signalled and all(_failed_on_peers(state, r, first) for r in waited)
                       and (len(lost) > 1 or any(told_any[r.rank] for r in waited))
                       and all(r.host in stopped_hosts for r in waited)):
        return None
    if last - first > (LOST_TOGETHER_S if signalled else STOPPED_TOGETHER_S):
        return None
    # A first death alone before the others' burst is a launcher's reaction to it, unless its
    # reader saw it stopped too (a loaded host spaces one cancel's deaths as unevenly): then
    # the summary says who went first.
    alone = len(gone) > 1 and gone[1] - first > max(2 * (last - gone[1]), ALONE_BEFORE_S)
    head = min(lost, key=lambda r: r.exit_at)
    if alone and not told[head.rank]:
        return None
    if (head.ended or {}).get("not_sigterm") and any(told.values()):
        return None  # the first died otherwise (SIGKILL, a crash), the rest of a SIGTERM after
    if job_stop(state, s) is not None or any(_connection_alive(r, last, now, s) for r in lost):
        return None
    if now - last < s.reconnect_grace:
        return _PENDING
    hosts = sorted({r.host for r in ranks if r.host})
    where = ", ".join(hosts[:4]) + (" and more" if len(hosts) > 4 else "")
    seen = sorted({ended_label(r.ended) for r in lost if r.ended})
    saw = (f" ({'their hosts' if len(hosts) > 1 else 'their host' + chr(39) + 's'} reader saw "
           f"{'each' if signalled else 'some'} end by {' or '.join(seen)})" if seen else "")
    if waited:
        others = [r.rank for r in waited]
        what = (f"{ranks_label([r.rank for r in lost]).capitalize()} vanished within "
                f"{(last - first) * 1000:.0f} ms{saw}, and {ranks_label(others)} failed on "
                f"their closed connections before {agree(others, 'its', 'their')} own stop "
                "came")
    else:
        what = (f"All {len(ranks)} ranks vanished within {(last - first) * 1000:.0f} ms, none "
                f"with an exit or an error of its own{saw}")
    if alone:
        what += (f", rank {head.rank} first, {(gone[1] - first) * 1000:.0f} ms before the "
                 "others")
    return finding(
        "rank_lost", Severity.INFO, [], None,  # (it blames no rank: they are evidence)
        f"{what}: the job was stopped from outside.",
        "Nothing in the training points at one rank: every connection closed at once. A "
        "scheduler or launcher ended the whole job (`scancel`, a preemption, the allocation's "
        "time limit, SIGTERM or SIGKILL to the launcher's process group), or the job's host "
        "went down. If nobody stopped it, ask the scheduler who did (`sacct -j <job> -o "
        "JobID,State,ExitCode,Reason`, `kubectl describe pod`) and look at the host"
        f"{'s' if len(hosts) > 1 else ''} ({where or 'unknown'}): `last -x`, `journalctl -k "
        "-b -1`. To end cleanly on such a stop, catch SIGTERM and save a checkpoint.",
        {"how": "stopped", "spread_s": last - first, "hosts": hosts,
         "lost": {str(r.rank): {"pid": r.pid, "host": r.host, "at": r.exit_at,
                                **({"ended": ended_label(r.ended)} if r.ended else {})}
                  for r in lost},
         **({"failed_on_peers": [r.rank for r in waited]} if waited else {})},
        last, key="job")


def _failed_on_peers(state: JobState, r: RankState, first_lost: float) -> bool:
    """Whether a rank failed with an error that only says a peer was gone (a victim's: gloo's
    closed connection, a reset), raised after the first rank of the job vanished."""
    if r.status != RankStatus.FAILED:
        return False
    err = state.last_error(r.rank)
    cause = classify_error(err, backend_of(state)) if err else None
    return cause is not None and cause.victim and err["t"] >= first_lost - FAILED_TOGETHER_S


def _together(state: JobState, found: list[Finding]) -> list[Finding]:
    """Ranks of one host lost alike and together are one finding: a node that lost power,
    rebooted or fell off the network takes all its ranks at once (8 criticals for one
    fault, before). Alike: connections closed without a goodbye within LOST_TOGETHER_S of
    each other, or heartbeats that stopped, connections open, within SILENT_TOGETHER_S (a
    host that hangs or loses power closes nothing), none read from outside. Agents that gave
    up on a server behind them stay on their own. The hint starts at the host when every
    rank it ran is in the finding, at the processes when some of its ranks still report."""
    by_host: dict[tuple[str, str], list[Finding]] = {}
    out = []
    for f in sorted(found, key=lambda f: (f["evidence"]["last_seen"], f["ranks"])):
        ev = f["evidence"]
        if ev.get("how") in ("killed", "silent") and ev.get("host") and \
                "read_from_outside" not in ev:
            by_host.setdefault((ev["host"], ev["how"]), []).append(f)
        else:
            out.append(f)
    for (host, how), lost in by_host.items():
        window = LOST_TOGETHER_S if how == "killed" else SILENT_TOGETHER_S
        at = (lambda f: f["first_seen"]) if how == "killed" else \
            (lambda f: f["evidence"]["last_seen"])
        lost.sort(key=at)
        alike = [f for f in lost if at(f) - at(lost[0]) <= window]
        out += [f for f in lost if f not in alike]
        if len(alike) == 1:
            out.append(alike[0])
        else:
            out.append(_lost_host(state, host, how, alike))
    return sorted(out, key=lambda f: f["ranks"])


def _lost_host(state: JobState, host: str, how: str, alike: list[Finding]) -> Finding:
    first = min(alike, key=lambda f: f["first_seen"])
    ranks = [f["ranks"][0] for f in alike]
    who = ranks_label(ranks)
    others = sorted(r.rank for r in state.ranks() if r.host == host and r.rank not in ranks
                    and r.status in (RankStatus.RUNNING, RankStatus.INITIALIZING))
    if how == "killed":
        summary = (f"{who.capitalize()} vanished together on {host}: their connections closed "
                   "without a clean exit.")
        host_text = (f"Did {host} reboot, lose power or its network (`last -x`, `journalctl -k "
                     f"-b -1` on {host}, the cluster's node events: `sinfo -R`, `kubectl "
                     "describe node`), or did the OOM killer take several processes (`dmesg -T "
                     f"| grep -iE 'killed process|out of memory'` on {host})? ")
    else:
        summary = (f"{who.capitalize()} went silent together on {host}: their heartbeats "
                   "stopped at the same moment, their connections still open.")
        host_text = (f"Does {host} answer at all (`ping {host}`, `ssh {host} uptime`, its "
                     "console or BMC)? A host that panics, hangs or loses power closes no "
                     "connection. Once it is back: `journalctl -k -b -1` on it, and the "
                     "cluster's node events (`sinfo -R`, `kubectl describe node`). ")
    if others:
        hint = (f"These ranks of {host} went at the same moment while its "
                f"{ranks_label(others)} still {agree(others, 'reports', 'report')}: not the "
                "host itself, but something its processes share (the OOM killer, a shared "
                "filesystem, a scheduler's suspend or kill of part of the job). ")
    else:
        hint = (f"Every rank of {host} went at the same moment: look at the host before the "
                f"processes. {host_text}")
    ended = {ended_label(state.rank_index()[k].ended) for k in ranks
             if k in state.rank_index()}
    if how == "killed" and len(ended) == 1 and None not in ended:
        hint += f"Their host's reader saw each end by {ended.pop()}. "
    elif how == "killed":
        hint += f"The launcher's exit codes for {who} say how they ended (-9 is SIGKILL). "
    return finding(
        "rank_lost", Severity.CRITICAL, ranks, None, summary,
        hint + "Errors on other ranks after this moment are consequences.",
        {**first["evidence"], "lost": {str(f["ranks"][0]): {
            "pid": f["evidence"]["pid"], "last_seen": f["evidence"]["last_seen"]}
            for f in alike}, "host_ranks_running": others},
        first["first_seen"], key=f"r{first['ranks'][0]}")


def _lost_each(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    failed: dict[int, Any] | None = None
    for r in state.ranks():
        if r.status == RankStatus.LOST and _consequence(state, r, s):
            continue
        killed = False
        if r.status == RankStatus.LOST:
            since, how = r.exit_at or r.last_seen, "its connection closed without a clean exit"
            grace = s.reconnect_grace
            killed = True
            if r.closed_owed_s >= s.owed_close_after:  # it gave up on this server: patience
                grace = s.lost_after
                killed = False
                how = (f"its connection closed after the server had kept it waiting "
                       f"{r.closed_owed_s:.0f} s for an acknowledgement, and it did not come "
                       f"back within {grace:.0f} s")
            elif r.closed_goodbye:
                # Its agent closed it (a websocket close frame, Socket.IO's disconnect
                # packet): alive then, and an agent closes only to connect again (after its
                # exit it is not lost); a killed process sends none. Owed nothing, when the
                # server was too busy to read its batch before its ack timeout ran out
                # (bench/capacity.py --wire v1, 512 ranks: rank_lost critical, no owed_s).
                grace, killed = s.lost_after, False
                how = (f"its agent closed its connection (alive then: a dead process cannot "
                       f"say goodbye) and did not come back within {grace:.0f} s")
            if min(now, _heard_until(state)) - since < grace:
                continue
        elif r.status in (RankStatus.RUNNING, RankStatus.INITIALIZING):
            # Against the others while most are heard; on the clock when most are silent
            # too (a frozen job, a partition: the connections may stay open).
            everyone = _heard_until(state)
            horizon = now if now - everyone > s.lost_after else \
                min(now, _heard_until(state, r))
            heard = horizon - r.last_seen
            if heard <= s.lost_after:
                continue
            since = r.last_seen + s.lost_after
            how = f"nothing heard from it for {heard:.0f} s (heartbeats stopped)"
        else:
            continue
        if _connection_alive(r, since, now, s):
            continue
        if failed is None:  # once per judgement: a server can see many ranks go at once
            failed = {v.rank: state.last_error(v.rank) for v in state.ranks()
                      if v.status == RankStatus.FAILED}
        victims = {k: v for k, v in failed.items() if k != r.rank}
        evidence = {"last_seen": r.last_seen, "host": r.host, "pid": r.pid,
                    "how": "killed" if killed else "silent" if r.status != RankStatus.LOST
                    else "gave up",
                    "victims": {str(k): v for k, v in victims.items()}}
        ended = ended_label(r.ended) if r.status == RankStatus.LOST else None
        if ended:
            evidence["ended"] = ended
            how += f"; it ended by {ended}"
        dead = ended_hint(r) + "The end of that rank's own log says more. " if ended else (
                f"Look for why process {r.pid} on {r.host} died: `dmesg -T | grep -iE "
                f"'killed process|out of memory'` on {r.host} (OOM killer), the launcher's "
                f"exit code for rank {r.rank} (-9 is SIGKILL; -15, SIGTERM, a scheduler that "
                "preempted or cancelled it: `sacct -j <job>`, `kubectl describe pod`; -6, "
                "SIGABRT, is a C++ abort: gloo's \"Received data size doesn't match expected "
                "size\" or a `gloo::EnforceNotMet` means ranks passed one collective tensors "
                "of different sizes, and gloo aborts the rank that received the odd message, "
                "not always the one that sent it: compare the shapes every rank passes to "
                "that collective), and the end of that rank's own log. ")
        if r.status == RankStatus.LOST:
            summary, hint = f"Rank {r.rank} vanished{process_label(r)}: {how}.", dead
        else:
            summary, hint, outside = _silent(state, r, how, now, dead)
            if outside is not None:
                evidence["read_from_outside"] = outside
        out.append(finding("rank_lost", Severity.CRITICAL, [r.rank], None, summary,
                           hint + "Errors on other ranks after this moment are consequences.",
                           evidence, since, key=f"r{r.rank}"))
    return out


def _silent(state: JobState, r: RankState, how: str, now: float,
            dead: str) -> tuple[str, str, dict[str, Any] | None]:
    """What a rank whose heartbeats stopped while its connection stayed open is known to be
    doing, as (summary, hint, the reading's evidence): frozen, when another rank of its host
    read it from outside since (a snapshot's ``peer`` reading, dashboard.ingest.asks), else
    dead or frozen, not known which (no reading)."""
    reading = max((peers[r.rank] for peers in state.snapshot_peers.values()
                   if r.rank in peers and peers[r.rank].get("peer_dump")
                   and r.last_seen <= peers[r.rank]["t"] <= now),
                  key=lambda p: p["t"], default=None)
    if reading is None:
        return (f"Rank {r.rank} went silent{process_label(r)}: {how}, its connection still "
                "open.",
                "Its process may be frozen rather than dead: a thread blocked in C with the "
                "GIL held stops the agent too (a C extension that does not release it, a "
                "regular expression, a lock), as does a stopped process (SIGSTOP, a "
                f"debugger) or a host that stopped answering. {stack_commands(state, [r.rank])} "
                "shows which (a snapshot asks a rank of that host, or its host reader, to do it). "
                "If it is gone: "
                f"{dead[0].lower()}{dead[1:]}", None)
    holder = gil_holder(reading["peer_dump"])
    outside = {"by": reading["by"], "t": reading["t"], "gil_held_by": holder}
    if reading.get("reader_pid"):  # the host's reader process (pgdash_agent.reader)
        outside.update(host_reader=True, reader_pid=reading["reader_pid"])
        reader = f"pgdash's reader process on its host (pid {reading['reader_pid']})"
    else:
        reader = f"rank {reading['by']} on its host"
    where = where_blocked(reading["peer_dump"])
    summary = (f"Rank {r.rank} is frozen{process_label(r)}: {how}; {reader} read it from "
               f"outside: "
               + (f"blocked with the GIL held by its thread {holder}" if holder
                  else "alive, its agent not running")
               + (f", in {where}." if where else "."))
    if holder:
        return summary, ("Its agent cannot run while that thread holds the GIL. The "
                         "snapshot's reading (native frames, innermost first) shows the call "
                         "that holds it: a C extension or custom op that does not release the "
                         "GIL around long work, a regular expression that backtracks, a lock "
                         "taken with the GIL held. "), outside
    return summary, ("No thread holds the GIL, yet the agent's thread does not run: the "
                     "process may be stopped (SIGSTOP, a debugger) or starved; the snapshot's "
                     "reading shows where each thread stands. "), outside


def rank_failed(state: JobState, now: float, s: Settings) -> list[Finding]:
    failed = [r for r in state.ranks() if r.status == RankStatus.FAILED and not is_init_failure(state, r)]
    if not failed:
        return []
    causes = {}
    for r in failed:
        err = state.last_error(r.rank)
        cause = classify_error(err, backend_of(state)) if err else None
        causes[r.rank] = (err, cause)
    # After a rank left early, or a hung job was stopped, failures that only waited on a peer
    # (or said nothing) are that cause's evidence: not findings, and nobody to blame here.
    # A rank interrupted by Ctrl-C was stopped by someone, not at fault; so is one that ended
    # itself with a status once the job was being stopped (a preemption handler's
    # ``sys.exit(143)``, SLURM's requeue convention: 128 + SIGTERM).
    stopped = interrupted_at(state)
    failed = [r for r in failed if not ((causes[r.rank][1] is None or causes[r.rank][1].victim)
                                        and _consequence(state, r, s))
              and (causes[r.rank][1] is None or causes[r.rank][1].cause != "interrupted")
              and not (stopped is not None and (causes[r.rank][0] or {}).get("where") == "exit"
                       and causes[r.rank][0]["t"] >= stopped - INTERRUPT_BEFORE_S)]
    if not failed:
        return []
    lost = [r.rank for r in state.ranks() if r.status == RankStatus.LOST]
    culprits = [r for r in failed if causes[r.rank][1] is None or not causes[r.rank][1].victim]
    # Errors every rank raises alike, whose texts single out the ranks at fault: DDP's model
    # check (the ranks whose model differs), dcp's CheckpointException (the ranks it names;
    # the others' is its echo).
    odd_models = _odd_models(causes)
    for cause_id, at_fault in (("ddp_model_mismatch", odd_models),
                               ("checkpoint_failed", _named_by_checkpoint(causes))):
        if at_fault:
            culprits = [r for r in culprits if r.rank in at_fault
                        or causes[r.rank][1].cause != cause_id]
    if not odd_models:
        held = _ddp_vote_pending(state, culprits, causes, now)
        if culprits and not held:
            return []  # nobody to name before the vote closes
        culprits = held
    held = _together_pending(state, culprits, causes, now)
    if culprits and not held:
        return []  # a peer's report may show what ended them all (rules.desync)
    culprits = held
    victims = [r for r in failed if r not in culprits]
    if not culprits and not lost:
        # Everyone who failed was waiting on a peer: blame the first to fail, say so; but not
        # while a rank still runs, for TOGETHER_WAIT_S: the peer whose end they met is
        # likely that rank, its disconnect on its way (alltoall_split_mismatch: a victim's
        # error came 24 ms before the aborted rank's connection closed).
        first = min(victims, key=lambda r: (causes[r.rank][0] or {}).get("t", r.exit_at or 0))
        began = (causes[first.rank][0] or {}).get("t", first.exit_at or now)
        if now - began < TOGETHER_WAIT_S and any(r.status == RankStatus.RUNNING
                                                  for r in state.ranks()):
            return []
        culprits = [first]
        victims = [r for r in victims if r is not culprits[0]]
    out = []
    for alike in _alike(culprits, causes):
        r = alike[0]  # the first of them to fail
        ranks = [a.rank for a in alike]
        err, cause = causes[r.rank]
        text = err["error"] if err else "the process exited unsuccessfully"
        bug = code_bug(err, cause)
        first = text.strip().splitlines()[0][:160] if text.strip() else ""
        at = frame_label(bug) if bug else None
        if cause is None:
            title = "exited with an error"
        elif cause.cause == "unknown":  # the error's own words say more than "unrecognised"
            error_type = err.get("error_type") or "error"
            title = (f"{error_type} at {at}" if at else error_type) + (f": {first}" if first
                                                                         else "")
        else:
            title = cause.title
        who = ranks_label(ranks)
        if bug is not None:
            hint = _bug_hint(who, err, bug)
        elif cause is not None and err.get("where") == "exit":
            hint = (f"The program ended itself with a non-zero status (`sys.exit`, or a "
                    f"library that called it): the reason is at the end of {who}'s log.")
        else:
            hint = cause.hint if cause else "Read the end of this rank's log."
        said = (f"{who.capitalize()} failed the same way: {title}" if len(alike) > 1 else
                f"Rank {r.rank} failed{process_label(r)}: {title}")
        out.append(finding(
            "rank_failed", Severity.CRITICAL, ranks, err.get("group") if err else None,
            sentence(said),
            hint + (" The other failures are consequences of this one." if victims else ""),
            {**({"at": at} if at else {}),
             "error": text, "error_type": err.get("error_type") if err else None,
             "where": err.get("where") if err else None, "op": err.get("op") if err else None,
             "seq": err.get("seq") if err else None,
             "cause": "code_bug" if bug is not None else cause.cause if cause else None, "details": cause.details if cause else {},
             "victims": {str(v.rank): (causes[v.rank][0] or {}).get("error") for v in victims},
             **({"traceback": err["traceback"]} if err and err.get("traceback") else {}),
             **({"traceback_omitted": err["traceback_omitted"]}
                if err and err.get("traceback_omitted") else {}),
             **({"causes": err["causes"]} if err and err.get("causes") else {})},
            (err or {}).get("t") or r.exit_at or r.last_seen, key=f"r{r.rank}"))
    return out


def _alike(culprits: list[RankState],
           causes: dict[int, tuple[Any, Any]]) -> list[list[RankState]]:
    """The culprits as groups of ranks that failed the same way, each group in the order its
    ranks failed: an error no rule knows, raised at the same place with the same words but
    for numbers (a bug every rank hits: 1,024 ranks of it are one finding), or a known error
    whose finding would say the same for each. A rank with no error text stands alone."""
    def failed_at(r: RankState) -> float:
        return (causes[r.rank][0] or {}).get("t") or r.exit_at or r.last_seen or 0.0

    groups: dict[Any, list[RankState]] = {}
    for r in sorted(culprits, key=lambda r: (failed_at(r), r.rank)):
        err, cause = causes[r.rank]
        if not err or not (err.get("error") or "").strip():
            groups[("alone", r.rank)] = [r]
            continue
        if cause is not None and cause.cause != "unknown":  # a known error: alike where
            key = (cause.cause, cause.title, cause.hint)  # its finding would say the same
        else:
            frames = err.get("traceback") or []
            place = (frames[-1].get("file"), frames[-1].get("line")) if frames else None
            key = (err.get("error_type"), err.get("where"), place,
                   _DIGITS.sub("#", err["error"].strip().splitlines()[0]))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


_DIGITS = re.compile(r"\d+")


def _ddp_vote_pending(state: JobState, culprits: list[RankState],
                      causes: dict[int, tuple[Any, Any]], now: float) -> list[RankState]:
    """The culprits less those of DDP's model check while its vote is still open: every rank
    raises it, each naming itself and one peer; the first to report alone is a tie of two
    counts (bench/corpus/ddp_model_mismatch.py's rank 0 was named before rank 2's and rank
    1's errors outvoted it). Held until
    every rank reported it or DDP_VOTE_WAIT_S passed since the first did."""
    def voting(r: RankState) -> bool:  # (the count variant: the shape variant names no count)
        cause = causes[r.rank][1]
        return cause is not None and cause.cause == "ddp_model_mismatch" and \
            "params" in cause.details
    raised = [causes[r.rank][0]["t"] for r in culprits if voting(r)]
    if not raised or len(raised) >= (state.world_size or 0) or \
            now - min(raised) >= DDP_VOTE_WAIT_S:
        return culprits
    return [r for r in culprits if not voting(r)]


def _together_pending(state: JobState, culprits: list[RankState],
                      causes: dict[int, tuple[Any, Any]], now: float) -> list[RankState]:
    """The culprits less those that failed within FAILED_TOGETHER_S of another, while a rank
    of the job still runs, for TOGETHER_WAIT_S after the last of them: ranks that fail at the
    same instant were likely ended by one thing (a broadcast_object_list of another length on
    the rank still running: its receivers fail unpickling garbage, or allocating a garbage
    size, each with an error of its own or with one alike), and that rank's report, a moment
    later, says which (rules.desync). bench/corpus/broadcast_object_list_len_mismatch.py:
    ranks 1 and 2 failed 0.43 s before rank 0's broadcast failed on their closed
    connections; in another run both raised RuntimeError (an absurd allocation, a size that
    is not a concrete integer), which the rule, then holding only failures of different
    exception types, named as two culprits."""
    raised = sorted((causes[r.rank][0]["t"], r.rank) for r in culprits if causes[r.rank][0])
    together = {rank: t for i, (t, rank) in enumerate(raised)
                if (i and t - raised[i - 1][0] <= FAILED_TOGETHER_S)
                or (i + 1 < len(raised) and raised[i + 1][0] - t <= FAILED_TOGETHER_S)}
    if not together or now - max(together.values()) >= TOGETHER_WAIT_S or \
            not any(r.status == RankStatus.RUNNING for r in state.ranks()):
        return culprits
    return [r for r in culprits if r.rank not in together]


def _odd_models(causes: dict[int, tuple[Any, Any]]) -> set[int]:
    """The ranks whose model differs from the others', from DDP's construction check: every rank
    raises it, each naming its own parameter count and the first other rank's that differs.
    The counts the texts give per rank outvote each other; no rank is singled out (an empty
    set) when no count is held by more ranks than any other (two ranks, each naming the other)."""
    counts: dict[int, int] = {}
    for _err, cause in causes.values():
        if cause is not None and cause.cause == "ddp_model_mismatch":
            d = cause.details
            for rank, n in ((d.get("rank"), d.get("params")),
                            (d.get("peer"), d.get("peer_params"))):
                if isinstance(rank, int) and isinstance(n, int):
                    counts[rank] = n
    tally = collections.Counter(counts.values()).most_common()
    if len(tally) < 2 or tally[0][1] == tally[1][1]:
        return set()
    return {rank for rank, n in counts.items() if n != tally[0][0]}


def _named_by_checkpoint(causes: dict[int, tuple[Any, Any]]) -> set[int]:
    """The ranks torch.distributed.checkpoint names in the CheckpointException it raises on
    every rank."""
    return {rank for _err, cause in causes.values()
            if cause is not None and cause.cause == "checkpoint_failed"
            for rank in cause.details.get("ranks") or ()}


def _bug_hint(who: str, err: dict[str, Any], bug: dict[str, Any]) -> str:
    """The next step for a bug of the training code: the line, not distributed debugging."""
    error_type = err.get("error_type") or "an exception"
    if not bug:
        return (f"This is a bug in the training code (or in the data it read), not a "
                f"distributed fault: {who} raised {error_type}. Its traceback, at the "
                f"end of {who}'s log, names the line to fix.")
    raised = (err.get("traceback") or [bug])[-1]
    inside = (f", raised inside {frame_label(raised)}" if raised is not bug else "")
    code = f" (`{bug['code']}`)" if bug.get("code") else ""
    function = bug.get("function")
    in_function = f" in {function}()" if function and function != "<module>" else ""
    return (f"This is a bug in the training code (or in the data it read), not a distributed "
            f"fault: {who} raised {error_type} at {bug.get('file')}:{bug.get('line')}"
            f"{in_function}{code}{inside}. Fix that line; the whole traceback is in the evidence.")
