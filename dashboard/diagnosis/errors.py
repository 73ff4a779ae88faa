"""Error causes: turns the text of one rank's distributed error into a cause, a hint and its values.

Matches the text against the catalogue of known gloo, TCPStore, rendezvous and NCCL error texts
(``RULES`` in dashboard.diagnosis.known_errors), types the values the match and the extractors
found, fills the rule's hint with them, and says something useful for a text no rule knows. No
Flask, no SQL, no torch. ``classify`` is a pure function of the text, so the server, the agent and
the tests all get the same answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from dashboard.diagnosis.known_errors import EXTRACTORS, RULES, Rule

MAX_SCAN_CHARS = 64 * 1024  # regex work per text is bounded: only this much of it is scanned
TAIL_SCAN_CHARS = 16 * 1024  # of which this much from the end (a traceback ends with the error)
MAX_ERROR_TYPE_CHARS = 100


@dataclass(frozen=True)
class Cause:
    """What an error text means.

    Attributes:
        cause: stable id, e.g. ``"gloo_timeout"``; ``"unknown"`` when no rule matched.
        title: one line a person understands.
        hint: what to check or run next (1-3 sentences), filled with the values parsed from the text.
        victim: True when this error usually means another rank is at fault (this rank waited on
            a peer that crashed, hung or never arrived); False when this rank itself is the cause.
        details: values parsed from the text. Numbers are ints. Keys in use: ``host``, ``port``,
            ``timeout_ms``, ``timeout_s``, ``direction``, ``seq``, ``op``, ``numel_in``,
            ``numel_out``, ``ran_ms``, ``joined``, ``expected``, ``missing``, ``variable``,
            ``rank``, ``size``, ``keys``, ``peer`` (the one other rank the text points at),
            ``peers`` (a list of such ranks), ``ranks``, ``device``, ``pg``, ``pg_name``,
            ``nccl_version``, ``last_enqueued``, ``last_completed``, ``last_finished``,
            ``error_type``.
    """

    cause: str
    title: str
    hint: str
    victim: bool
    details: dict[str, Any] = field(default_factory=dict)


_INT_KEYS = frozenset({
    "port", "timeout_ms", "timeout_s", "seq", "numel_in", "numel_out", "ran_ms", "joined",
    "expected", "rank", "size", "peer", "last_enqueued", "last_completed", "last_finished",
    "stuck_s", "pg", "params", "peer_params", "param",
})
_LIST_KEYS = frozenset({"peers", "ranks"})  # "0, 1, 2" or "rank 1 and rank 0" -> [0, 1, 2]
_ALIASES = {"seq2": "seq"}  # a regex may not reuse a group name across alternatives
# Placeholders a template may use that ``_typed`` computes from other groups: name -> sources.
_DERIVED = {"missing": ("joined", "expected"), "peer": ("peers",)}

_GENERIC_HINT = ("pgdash has no rule for this error yet: read this rank's full log around the first "
                 "error, then rerun with `TORCH_DISTRIBUTED_DEBUG=DETAIL` (and `NCCL_DEBUG=INFO` "
                 "on NCCL) for a more specific message.")
_GLOO_HINT = _GENERIC_HINT.replace(" (and `NCCL_DEBUG=INFO` on NCCL)", "")  # a gloo job's
INTERRUPTED_HINT = ("This rank was interrupted (Ctrl-C in the launcher's terminal, or SIGINT): "
                    "someone stopped the job; it did not fail by itself.")
_TYPE_HINTS = {
    "DistStoreError": "A DistStoreError comes from the TCPStore rendezvous: check that rank 0 is up "
                      "and that MASTER_ADDR, MASTER_PORT and WORLD_SIZE match on every rank.",
    "DistNetworkError": "A DistNetworkError is a socket failure: check that MASTER_ADDR:MASTER_PORT "
                        "is reachable from this host (`nc -zv $MASTER_ADDR $MASTER_PORT`).",
    "DistBackendError": "A DistBackendError comes from the backend (NCCL): look for the first "
                        "`NCCL WARN` line with `NCCL_DEBUG=INFO`.",
}


def classify(text: str | bytes | None, error_type: str | None = None,
             backend: str | None = None) -> Cause:
    """Names the cause of one rank's error text.

    Never raises: whatever the input, the answer is a Cause (``"unknown"`` when no rule matches).

    Args:
        text: the error message or log excerpt, verbatim. Only the first and last parts of a
            huge text are scanned (``MAX_SCAN_CHARS`` in all).
        error_type: the exception class name (``"DistStoreError"``, ``"RuntimeError"``, ...);
            it sharpens the hint for texts no rule knows.
        backend: the job's backend when known (``"gloo"``: the hint for texts no rule knows
            leaves NCCL's advice out).
    """
    try:
        scanned = _scannable(text)
        kind = error_type[:MAX_ERROR_TYPE_CHARS] if isinstance(error_type, str) else None
        if kind == "KeyboardInterrupt":
            return Cause("interrupted", "interrupted (Ctrl-C or SIGINT)", INTERRUPTED_HINT,
                         True, {"error_type": kind})
        for rule in RULES:
            match = rule.pattern.search(scanned)
            if match:
                cause = _cause(rule, match, scanned, kind)
                if rule.wraps:
                    return _wrapping(cause, classify(scanned[match.end():], None, backend))
                return cause
        return _unknown(scanned, kind, backend)
    except Exception:  # a diagnosis helper must never take down the ingest path that calls it
        return _unknown("", None)


def _wrapping(cause: Cause, inner: Cause) -> Cause:
    """A known error that wraps another: where a rule knows the wrapped one, its hint and
    title lead (the wrapper's title after it; ``details["inner"]`` names it); the cause stays
    the wrapper's."""
    if inner.cause in ("unknown", "interrupted"):
        return cause
    return Cause(cause.cause, f"{inner.title} ({cause.title})", inner.hint, cause.victim,
                 {**inner.details, **cause.details, "inner": inner.cause})


def classify_error(err: dict[str, Any], backend: str | None = None) -> Cause:
    """Names the cause of an error event (``error``, ``error_type`` and, from newer agents,
    ``causes``: the exceptions it was raised from, nearest first). Where its own text is
    unknown, the first chained exception whose text is known names it, its title saying so
    (``details["raised_as"]`` then holds the type the program raised, ``details["raised_from"]``
    the line that says why): a trainer's "could not save the checkpoint" raised from the
    OSError that says the disk is full. Never raises."""
    cause = classify(err.get("error"), err.get("error_type"), backend)
    if cause.cause != "unknown":
        return cause
    try:
        for chained in err.get("causes") or ():
            known = classify(chained.get("error"), chained.get("error_type"), backend)
            if known.cause != "unknown":
                first = str(chained.get("error") or "").strip().splitlines()[:1]
                raised_as = cause.details.get("error_type")
                raised_from = (f"{known.details.get('error_type') or 'error'}: "
                               f"{first[0][:160]}" if first else None)
                title = (f"{known.title} ({raised_as or 'an error'} raised from {raised_from})"
                         if raised_from else known.title)
                return replace(known, title=title, details={
                    **known.details, "raised_as": raised_as, "raised_from": raised_from})
    except Exception:  # a malformed chain: the error's own cause stands
        pass
    return cause


def _scannable(text: object) -> str:
    """The part of ``text`` worth scanning, as str: the head and the tail of a huge one."""
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        if len(raw) > MAX_SCAN_CHARS:
            raw = raw[:MAX_SCAN_CHARS - TAIL_SCAN_CHARS] + b"\n" + raw[-TAIL_SCAN_CHARS:]
        return raw.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        text = str(text)
    if len(text) > MAX_SCAN_CHARS:
        text = text[:MAX_SCAN_CHARS - TAIL_SCAN_CHARS] + "\n" + text[-TAIL_SCAN_CHARS:]
    return text


def _cause(rule: Rule, match: re.Match[str], scanned: str, error_type: str | None) -> Cause:
    details: dict[str, Any] = {}
    for name, value in match.groupdict().items():
        if value is not None:
            details[_ALIASES.get(name, name)] = value
    details = _typed({**_extract(scanned), **details})
    if error_type:
        details["error_type"] = error_type
    values = _Fill(details)
    return Cause(rule.cause, rule.title.format_map(values), rule.hint.format_map(values),
                 rule.victim, details)


def _extract(scanned: str) -> dict[str, str]:
    """The ``EXTRACTORS`` values found in the text, first occurrence of each."""
    found: dict[str, str] = {}
    for extractor in EXTRACTORS:
        match = extractor.search(scanned)
        if match:
            found.update((k, v) for k, v in match.groupdict().items() if v is not None)
    return found


def _typed(details: dict[str, Any]) -> dict[str, Any]:
    """Numbers as ints, rank lists as lists, plus the values in ``_DERIVED``."""
    out: dict[str, Any] = {}
    for name, value in details.items():
        if name in _INT_KEYS:
            try:
                value = int(value)
            except ValueError:
                pass
        elif name in _LIST_KEYS:
            value = [int(n) for n in re.findall(r"\d+", value)]
        out[name] = value
    if isinstance(out.get("joined"), int) and isinstance(out.get("expected"), int):
        out["missing"] = out["expected"] - out["joined"]
    if "peer" not in out and len(out.get("peers", ())) == 1:
        out["peer"] = out["peers"][0]
    return out


class _Fill(dict):
    """Template values: lists read "0, 1", and a value the text lacked reads ``<name>``."""

    def __init__(self, details: dict[str, Any]):
        super().__init__({k: ", ".join(map(str, v)) if isinstance(v, list) else v
                          for k, v in details.items()})

    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def _unknown(scanned: str, error_type: str | None, backend: str | None = None) -> Cause:
    hint = _GLOO_HINT if backend == "gloo" else _GENERIC_HINT
    if error_type in _TYPE_HINTS:
        hint = f"{_TYPE_HINTS[error_type]} {hint}"
    details = _typed(_extract(scanned))
    if error_type:
        details["error_type"] = error_type
    title = f"unrecognised {error_type}" if error_type else "unrecognised error"
    return Cause("unknown", title, hint, False, details)
