"""Part II, automatic partitioning (book/automatic/).

- `partitioning`: the small programs the Part compiles and what the compiler did with them
  (automatic/computation_follows_sharding, automatic/explicit_sharding).
"""
