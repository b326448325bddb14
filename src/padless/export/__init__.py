"""Packing to disk (``padless pack``): ``parquet`` (the driver: map -> plan -> place -> write, resumable),
``stages`` (each stage on one shard), ``engine`` (local or Ray tasks), ``state`` (lock, job, checksums)."""
