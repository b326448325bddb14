"""Planning: sequence lengths -> which sequences share a row. Pure numpy: no tokens, no torch.

- ``plan``: the planners, overlong policies, :class:`~padless.planning.plan.PackPlan` and its stats.
- ``costs``: rows bounded by a second cost per sequence (image patches) as well as tokens, behind ``plan_packs(costs=, max_cost=)``.
- ``items``: the overlong policy applied to lengths (what the engines pack) and the engine of each strategy.
- ``_costpack``: the engines under a second cost (``costs``' two-limit best fit, next fit and ``wrapped``).
- ``_binpack``: the bin-packing engines behind ``plan`` (best fit decreasing on the length histogram, next fit, wrapped).
- ``slots``: one plan from merged length histograms, and the rule placing each shard's sequences.
- ``buffered``: the streaming planner (lengths arriving one by one, bounded buffer).
- ``schedule``: the per-epoch schedule of packed rows for data-parallel training.
- ``balance``: ranks and micro-batches balanced by cost (``a * l + l**2``) or tokens, the partition behind ``balance="cost"``.
- ``context_balance``: a row's documents ordered (and dealt over rows) so its context-parallel shards do equal attention work.
- ``lengths``: length statistics, padding fractions, synthetic lengths, length grouping.
- ``padding``: the one definition of padding (real vs computed tokens) the stats table and the bench share.
- ``partition``: the optimal partition of lengths into padded groups (bucketing, grouped attention).
- ``checks``: the argument checks and the overlong error every stage shares.
"""
