"""pgdash server: ingest, storage, diagnosis and the web page (``pgdash serve``)."""
