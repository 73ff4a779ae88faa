"""The only room that speaks SQL: the schema, the one writer thread, the event log and its
packs, jobs, checkpoints, the findings book's log, leases; the codecs of stored bodies and
states; compaction of old routine events. SQLite by default, PostgreSQL alike."""
