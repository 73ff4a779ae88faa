"""The only room that speaks SQL. Callers hold one ``Store`` (store.py) and use its parts: the
one writer thread, jobs and sessions, the event log and its packs, checkpoints, the findings
and the book's log, job owners; beside them the tables (schema.py), the ``--db`` URL and
migrations (database.py), the codecs of stored bodies, states and packs, and compaction of old
routine events. SQLite by default, PostgreSQL alike."""
