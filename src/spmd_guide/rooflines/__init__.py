"""Part V, rooflines (book/rooflines/).

- `hardware`: chips as data (`chips.toml`, every rate with its source), looked up by name,
  and which axes of a slice are rings (`axis_wraps`) (rooflines/rooflines; every page that
  prices on a chip reads `CHIPS`).
- `roofline`: counts from a compiled program, priced on a chip: `estimate` and `predict`
  (rooflines/rooflines, rooflines/parallelism).
- `formulas`: the closed forms worked by hand: arithmetic intensity, critical batches, when
  each strategy's communication hides, the overlapped ring's gain (rooflines/rooflines,
  rooflines/parallelism).
- `strategies`: the Part IV MLP's strategies compiled and priced on every chip, ranked
  (rooflines/parallelism; rooflines/transformer ranks the transformer's with it).
- `figures`: rooflines, curves and the predicted steps per strategy and chip (every page).
- `problems`: the worked problems and exercises, each answer computed from the chips file
  (rooflines/rooflines, rooflines/parallelism).

The transformer's own counts are in `spmd_guide.transformer.pricing`: a topic imports only
earlier ones.
"""
