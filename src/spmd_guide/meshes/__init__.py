"""Part I, devices, meshes and shardings (book/meshes/).

- `show`: where each piece of an array lives, as a text table, an HTML grid and a gallery
  (every page of Part I, and later pages that show a layout).
- `tpu_ring`: the device order of a TPU v2/v3 board and its ring diagram
  (meshes/devices_and_meshes).
- `tpu_slices`: the chips `jax.make_mesh` puts on each mesh axis of a 4- or 8-chip TPU v4,
  v5e, v5p or v6e slice, and what each group's chips form (meshes/devices_and_meshes; Part
  V prices collectives with it, rooflines/parallelism).
"""
