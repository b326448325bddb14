"""Planning: sequence lengths -> which sequences share a row. Pure numpy: no tokens, no torch.

``plan`` (planners, overlong policies, :class:`~padless.planning.plan.PackPlan`), ``_binpack`` (the
bin-packing engines), ``buffered`` (the streaming planner), ``schedule`` (the per-epoch distributed
schedule), ``lengths`` (length statistics, padding fractions, synthetic lengths, length grouping),
``checks`` (the argument checks and the overlong error every stage shares).
"""
