"""Part III, manual SPMD with `shard_map` (book/shard_map/).

- `collectives`: the collectives zoo (shard_map/shard_map_collectives).
- `collective_matmul`: the six ring matmuls and the fused bidirectional one, registry `VARIANTS` (shard_map/collective_matmuls).
- `vma_rules`: psum of an invariant value, varying/invariant mixes and `pcast`, `all_to_all`
  shapes (shard_map/shard_map_collectives).
- `ring_costs`: what a compiled collective matmul costs and holds, and its schedule drawn
  (shard_map/collective_matmuls).
"""
