"""spmd_guide: the tested code behind the book *SPMD in JAX*.

The package mirrors the book: ``spmd_guide.core`` is the base every page uses, and each
folder of ``book/`` has a subpackage of the same name holding that topic's modules
(``book/transformer/`` and ``spmd_guide.transformer``). Arrows point down only: ``core``
imports no topic, and a topic imports ``core`` and earlier topics.

Importing the package does not start JAX's backends, so ``ensure_devices`` can still
choose how many CPU devices to create. In IPython (a notebook, the book's build) it makes
matplotlib figures show as SVG with alt text (:func:`spmd_guide.core.drawing.use_svg_figures`).
"""

from spmd_guide.core.devices import ensure_devices, environment_summary
from spmd_guide.core.drawing import use_svg_figures

use_svg_figures()

__all__ = ["ensure_devices", "environment_summary"]
