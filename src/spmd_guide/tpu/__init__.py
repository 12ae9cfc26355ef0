"""Part XIV, compiled for a real TPU without one (book/tpu/).

- `topology`: a TPU slice by name (``"v5e:2x4"``), its compile-only devices, and
  `tpu_mesh` over them (tpu/compiling; every page of the Part).
- `programs`: each strategy of Parts IV and IX compiled by XLA:TPU; collectives, memory
  against the chip's HBM, cost analysis beside Part V's roofline (tpu/compiling).
- `schedule`: where the scheduled program starts each collective and where it waits for it
  (tpu/overlap).
- `compare`: the book's claims about "the compiler", compiled by XLA:CPU and XLA:TPU
  (tpu/cpu_vs_tpu).
- `kept`: the last kept TPU results, shown where libtpu is not available.
"""

from spmd_guide.tpu.topology import topology_devices, tpu_mesh, unavailable

__all__ = ["topology_devices", "tpu_mesh", "unavailable"]
