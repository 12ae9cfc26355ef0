"""Part V, rooflines (book/rooflines/).

- `hardware`: chips as data (`chips.toml`, every rate with its source), looked up by name,
  and which axes of a slice are rings (`axis_wraps`) (rooflines/rooflines; every page that
  prices on a chip reads `CHIPS`).
- `roofline`: counts from a compiled program, priced on a chip: `estimate` and `predict`
  (rooflines/rooflines, rooflines/parallelism).
- `formulas`: the closed forms worked by hand: arithmetic intensity, critical batches, when
  each strategy's communication hides, the overlapped ring's gain (rooflines/rooflines,
  rooflines/parallelism).
- `roofline_pages`: the MLP priced per strategy and chip, rankings, figures and the worked
  problems (rooflines/rooflines, rooflines/parallelism, rooflines/transformer).

The transformer's own counts are in `spmd_guide.transformer.pricing`: a topic imports only
earlier ones.
"""
