"""spmd_guide: the tested code behind the book *SPMD in JAX*.

Each submodule holds one idea and backs one family of chapters; the README's module map
lists them all. Two floors: the base (``checks``, ``devices``, ``display``, ``drawing``,
``hlo_text``, ``hlo``, ``traced``, ``timing``) imports nothing from the Parts; each Part
module imports the base and earlier Parts only.

Importing the package does not start JAX's backends, so ``ensure_devices`` can still
choose how many CPU devices to create. In IPython (a notebook, the book's build) it makes
matplotlib figures show as SVG with alt text (:func:`spmd_guide.drawing.use_svg_figures`).
"""

from spmd_guide.devices import ensure_devices, environment_summary
from spmd_guide.drawing import use_svg_figures

use_svg_figures()

__all__ = ["ensure_devices", "environment_summary"]
