"""Part II, automatic partitioning (book/automatic/).

- `partitioning`: the small programs the Part compiles and what the compiler did with them
  (automatic/computation_follows_sharding, automatic/explicit_sharding).
- `hidden_collectives`: loops over sharded predicates, sorts and shuffles, each beside its
  `shard_map` version (automatic/what_jit_adds).
- `closures`: a closed-over array compiled in whole, and the argument that fixes it
  (automatic/what_jit_adds).
- `uneven`: what a sharding constraint does on a length the mesh does not divide; padding and
  FSDP's choice of dimension (automatic/what_jit_adds).
"""
