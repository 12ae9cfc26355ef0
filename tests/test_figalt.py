"""book/_ext/figalt.py: a glued figure's ``:alt:`` replaces the alt text of its <img>."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "book" / "_ext"))

from figalt import with_alt  # noqa: E402


def test_alt_replaces_the_first_images_alt_and_is_escaped():
    markup = "<div><img src='a.svg' alt='Figure: ? against KiB' width='4'><img alt='x'></div>"
    out = with_alt(markup, "Bars of 'bytes' & more")
    assert "alt='Bars of &#x27;bytes&#x27; &amp; more'" in out
    assert "Figure: ?" not in out and out.endswith("<img alt='x'></div>")


def test_alt_is_added_where_the_image_has_none():
    assert with_alt('<img src="a.png">', "A plot") == "<img alt='A plot' src=\"a.png\">"
