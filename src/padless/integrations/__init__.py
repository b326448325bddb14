"""padless inside other libraries' training loops. Each module imports its library only when used.

- ``datasets``: ``pack_dataset``, a drop-in for ``trl.pack_dataset`` planned by padless over the whole
  dataset, or through a bounded buffer for an ``IterableDataset`` (``padless[data]``).
- ``dataset_plans``: ``pack_dataset``'s plans (TRL's strategy names, lengths -> one plan, the logging).
- ``datasets_stream``: ``pack_dataset`` of an ``IterableDataset``, packed as it streams.
- ``transformers``: ``PackedTrainer``, ``transformers.Trainer`` training planned packed rows
  (``padless[trainer]``).
- ``trainer_rows``: the rows a trainer trains: sampler, row view, fitted collator, loader, what the plan cut.
- ``trainer_boundary``: the trainers' start line, record checks and errors in the trainer's own words.
- ``trainer_context``: ``context_parallel=`` in those trainers: rows per replica, balanced, split over each cp group, one loss.
- ``first_step``: every trainer's first packed step checked on the model (an ``IsolationGuard``), and its cost.
- ``trl``: ``SFTTrainer`` with padless packing, configured through TRL's ``SFTConfig`` (``padless[trl]``).
- ``sft_records``: the records of that ``SFTTrainer``, every form ``load_corpus`` reads, checked and rendered by padless.
- ``trl_rl``: TRL's ``GRPOTrainer`` and ``DPOTrainer`` with every log-prob pass on packed rows (imported from ``trl`` too);
  their code: ``trl_logprobs`` (what both share), ``trl_grpo``, ``trl_dpo``.

Whether a batch another library built keeps its documents isolated: :mod:`padless.isolation.audit`.
"""
