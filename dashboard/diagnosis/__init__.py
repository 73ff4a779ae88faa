"""Diagnosis: findings that name the rank at fault, as pure functions of JobState and time.

A small package, one concern per module:

- ``core``: the ``Finding`` type, ``Severity``, ``Settings``.
- ``rules/``: the rule table (``RULES``) and ``diagnose``; rules by area (``crash``,
  ``hangs``, ``desync``, ``stragglers``, ``gpu``, ``rendezvous``).
- ``text``: how ranks, groups and processes are named in summaries and hints.
- ``incidents``: findings that share a root cause, grouped.
- ``book``: the lifecycle of a job's findings and incidents over time (live and replay).
- ``timeline``: replay: a job's state and book folded together, and the book's stored log read back.
- ``errors``: one rank's error text to its cause and hint; ``known_errors``: the known texts.
"""

from dashboard.diagnosis.core import SEVERITY_ORDER, Finding, Settings, Severity, finding
from dashboard.diagnosis.rules import RULES, diagnose

__all__ = ["RULES", "SEVERITY_ORDER", "Finding", "Settings", "Severity", "diagnose", "finding"]
