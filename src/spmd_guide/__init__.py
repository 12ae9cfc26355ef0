"""spmd_guide: the tested code behind the book *SPMD in JAX*.

Each submodule holds one idea and backs one family of chapters:

- :mod:`spmd_guide.devices` -- get 8 devices (real accelerators, or CPU mock devices).
- :mod:`spmd_guide.show` -- where each piece of an array lives (tables, HTML grids, gallery).
- :mod:`spmd_guide.hlo` -- what the compiler did: collectives, bytes moved, memory per device.
- :mod:`spmd_guide.timing` -- honest micro-benchmarks, and words that claim no more than they show.
- :mod:`spmd_guide.display` -- tables and caught errors for the pages.
- :mod:`spmd_guide.drawing` -- every picture: one palette, one font stack, SVG figures.
- :mod:`spmd_guide.partitioning` -- Part II: computation follows sharding, explicit sharding.
- :mod:`spmd_guide.collectives`, :mod:`spmd_guide.collective_matmul` -- Part III.
- :mod:`spmd_guide.nn`, :mod:`spmd_guide.strategies` -- Part IV: the MLP and its parallelisms.
- :mod:`spmd_guide.prng`, :mod:`spmd_guide.data` -- Part V: random numbers and sharded batches.
- :mod:`spmd_guide.multihost` -- Part VI: several JAX processes on one machine.
- :mod:`spmd_guide.api_changes` -- old spellings and their replacements, probed in the installed JAX.

Importing the package does not start JAX's backends, so ``ensure_devices`` can still
choose how many CPU devices to create. In IPython (a notebook, the book's build) it makes
matplotlib figures show as SVG with alt text (:func:`spmd_guide.drawing.use_svg_figures`).
"""

from spmd_guide.devices import ensure_devices, environment_summary
from spmd_guide.drawing import use_svg_figures

use_svg_figures()

__all__ = ["ensure_devices", "environment_summary"]
