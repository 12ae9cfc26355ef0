"""Part VI, measure what you predicted (book/profiling/): a ``jax.profiler`` trace of a
sharded step, read per device and checked against the compiled program.

- `tracing`: `capture(fn, *args, repeats)` -> `Trace` (ops per device and run, collective
  counts, compute/collective/wait time per device) (profiling/tracing, profiling/stragglers).
- `events`: the trace folder, its files and TraceEvents, read back and checked (damaged or
  foreign input refused by name); `tracing` re-exports `read_events` and `trace_files`.
- `annotations`: `StepTraceAnnotation`/`TraceAnnotation` spans read from a trace and lined
  up with the devices' runs; time per `jax.named_scope` (profiling/tracing).
- `measure`: what the pages measure with it: a straggler, warm-up against steady state, live
  memory per device from `jax.profiler.device_memory_profile` (profiling/stragglers).
"""
