"""Packing to disk (``padless pack``).

- ``parquet``: the driver: map -> plan -> place -> write over logical shards, atomic and resumable.
- ``stages``: each stage on one shard (tokenize + histogram, place, write a Parquet shard).
- ``engine``: who runs the stages: this process or Ray tasks.
- ``state``: the output folder's lock and job state (fingerprint, flags, checksums).
"""
