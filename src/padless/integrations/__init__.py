"""padless inside other libraries' training loops. Each module imports its library only when used.

- :mod:`padless.integrations.datasets`: ``pack_dataset``, a drop-in for ``trl.pack_dataset`` planned
  by padless over the whole dataset (``padless[data]``).
- :mod:`padless.integrations.transformers`: ``PackedTrainer``, ``transformers.Trainer`` training
  planned packed rows (``padless[trainer]``).
- :mod:`padless.integrations.trl`: ``SFTTrainer`` with padless packing, configured through TRL's
  ``SFTConfig`` (``padless[trl]``).
- :mod:`padless.isolation.audit`: whether a batch another library built keeps its documents
  isolated, checked on the model it feeds.
"""
