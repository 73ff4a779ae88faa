"""A stored job read back: the state at any moment (rewind), session files (archive: export
and import) and the Perfetto timeline (trace)."""
