"""Part VII, randomness and data (book/randomness/).

- `prng`: random numbers under sharding (randomness/random_numbers).
- `data`: sharded batch loading, `sharded_batches` (randomness/sharded_data).
"""
