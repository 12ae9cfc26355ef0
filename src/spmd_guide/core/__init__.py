"""The base every topic builds on: input checks (`checks`), devices and the one mesh
builder (`devices`), the one presentation layer (`display`), every picture (`drawing`;
per-device timelines in `timeline`),
reading compiled programs (`hlo_text` parses, `device_groups` reads which devices it names,
`hlo` compiles and counts, `hlo_loops` counts per loop trip), what JAX traced
(`traced`), honest timing (`timing`), benchmark tables kept with provenance (`results`), and
JAX's persistent compile cache for the build and the tests, off unless asked for
(`compile_cache`).

`core` imports no topic; every page uses it (`display`, `hlo` on most pages).
"""
