"""Part V, rooflines (book/rooflines/).

- `roofline`: chips as data (`chips.toml`, every rate with its source), counts and `predict`
  from a compiled program, the closed forms (rooflines/rooflines, rooflines/parallelism).
- `roofline_pages`: the MLP priced per strategy and chip, rankings, figures and the worked
  problems (rooflines/rooflines, rooflines/parallelism, rooflines/transformer).

The transformer's own counts are in `spmd_guide.transformer.pricing`: a topic imports only
earlier ones.
"""
