"""Packing to disk: ``sources`` (inputs to stream from) and ``parquet`` (atomic, resumable shards)."""
