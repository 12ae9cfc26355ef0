"""spmd_guide: the tested code behind the book *SPMD in JAX*.

Each submodule holds one idea and backs one family of chapters:

- :mod:`spmd_guide.devices` -- get 8 devices (real accelerators, or CPU mock devices).
- :mod:`spmd_guide.show` -- where each piece of an array lives.
- :mod:`spmd_guide.hlo` -- what the compiler did: collectives, bytes moved, memory.
- :mod:`spmd_guide.timing` -- honest micro-benchmarks.
- :mod:`spmd_guide.collective_matmul`, :mod:`spmd_guide.nn`, :mod:`spmd_guide.prng`,
  :mod:`spmd_guide.data`, :mod:`spmd_guide.multihost` -- Parts III to VI.

Importing the package does not start JAX's backends, so ``ensure_devices`` can still
choose how many CPU devices to create.
"""

from spmd_guide.devices import ensure_devices, environment_summary

__all__ = ["ensure_devices", "environment_summary"]
