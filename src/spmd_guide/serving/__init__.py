"""Part XII, serving the transformer (book/serving/).

- `serving`: the face: generation with a KV cache, greedy or sampled, with stop tokens and
  prompts of different lengths, the loop on the device (`generate`, `init_cache`, `serve`;
  serving/kv_cache, serving/sharded_serving, serving/sampling, serving/batching).
- `step`: the cache and the one serving step (prefill or decode), its layouts per strategy.
- `sampling`: choosing the next token: greedy, temperature, top-k, top-p.
- `batching`: continuous batching of a queue of requests through fixed cache slots.
- `costs`: prefill and decode compiled at a size worth pricing, their counts, and the
  predictions per chip: time per token, critical batch, the batch the cache memory allows,
  latency against throughput (serving/prefill_decode).

The face re-exports the names of the book's public contract, so that
``from spmd_guide.serving import generate, init_cache, serve`` works; the chapters import the
modules themselves.
"""

from spmd_guide.serving.serving import generate, init_cache, serve

__all__ = ["generate", "init_cache", "serve"]
