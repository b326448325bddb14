"""Packing to disk.

- ``sources``: inputs of tokenized examples for ``padless pack``, streamed with bounded memory.
- ``parquet``: atomic, resumable Parquet shards of packed rows.
"""
