"""Part XI, serving the transformer (book/serving/).

- `serving`: greedy generation with a KV cache, prefill then decode, on one device or laid
  out by a Part VIII strategy (`generate`, `init_cache`; serving/kv_cache,
  serving/sharded_serving).
- `costs`: prefill and decode compiled at a size worth pricing, their counts, and the
  predictions per chip: time per token, critical batch, the batch the cache memory allows,
  latency against throughput (serving/prefill_decode).

The face re-exports the names of the book's public contract, so that
``from spmd_guide.serving import generate, init_cache`` works; the chapters import the
modules themselves.
"""

from spmd_guide.serving.serving import generate, init_cache

__all__ = ["generate", "init_cache"]
