"""Reads of the knowledge base, shared by every front door: one module per kind of thing.

- ``collections``: a collection by name or UUID, the list with its totals, a model switch under way
- ``documents``: a document, a page of a collection's documents, chunks and a chunk's neighbours
- ``ingestion``: where ingestion stands, for writers who wait until their documents are searchable
- ``stats``: totals and size on disk
- ``health``: the checks behind ``/health`` (database, broker, workers, providers)
- ``admin``: the admin's own pages (dashboard, live status, delete confirmations, highlights)
- ``tokens``: API tokens

Search, the biggest read, is ``kb.search``.
"""
