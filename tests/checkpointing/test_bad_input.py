"""Every guarded argument of the Part XI functions through its class battery (battery.py):
directories ('' and Path(''), a file, a missing or foreign directory), steps, trees, flags,
strategy names. Each answer is the package's InputError naming the argument with nothing on
disk changed, or (for a valid form) the plain value's answer."""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
from battery import (
    Choice,
    Count,
    Flag,
    PathArg,
    Tree,
    anything,
    battery_tests,
    call,
    fresh_root,
)
from helpers import mesh_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import anatomy, checkpoint, crash, training
from spmd_guide.transformer import lm

CONFIG = lm.Config(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, seq_len=8)


def _state():
    mesh = mesh_of(4)
    w = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("x")))
    return {"w": w, "b": jnp.ones(4), "step": jnp.int32(3)}


def _fresh() -> pathlib.Path:
    """A new empty root with a directory name in it that does not exist yet."""
    return fresh_root() / "ckpt"


@functools.cache
def _saved() -> pathlib.Path:
    directory = _fresh()
    checkpoint.save(directory, _state(), step=1)
    checkpoint.save(directory, _state(), step=2)
    return directory


def _like():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        _state())


READERS = [
    call(checkpoint.restore, lambda: dict(directory=_saved(), like=_like(), step=1),
         directory=PathArg(), step=Count(0, optional=True), like=Tree()),
    call(checkpoint.restore_target, lambda: dict(directory=_saved(), like=_like(), step=1),
         directory=PathArg(), step=Count(0, optional=True), like=Tree(), same=anything),
    call(checkpoint.saved_arrays, lambda: dict(directory=_saved(), step=1),
         directory=PathArg(), step=Count(0, optional=True)),
    call(checkpoint.saved_layout, lambda: dict(directory=_saved(), step=1),
         directory=PathArg(), step=Count(0, optional=True), same=anything),
    call(checkpoint.steps, lambda: dict(directory=_saved()), directory=PathArg(reads=False)),
    call(checkpoint.latest_step, lambda: dict(directory=_saved()),
         directory=PathArg(reads=False)),
    call(anatomy.files, lambda: dict(step_directory=_saved() / "1"), step_directory=PathArg()),
    call(anatomy.listing, lambda: dict(step_directory=_saved() / "1"),
         step_directory=PathArg()),
    call(anatomy.read_plan, lambda: dict(directory=_saved(), like=_like(), step=1),
         directory=PathArg(), step=Count(0, optional=True), like=Tree()),
    call(anatomy.read_summary, lambda: dict(directory=_saved(), like=_like(), step=1),
         directory=PathArg(), step=Count(0, optional=True), like=Tree()),
    call(anatomy.file_bytes_read, lambda: dict(directory=_saved(), like=_like(), step=1),
         directory=PathArg(), step=Count(0, optional=True), like=Tree()),
]

WRITERS = [
    call(checkpoint.save, lambda: dict(directory=_fresh(), state=_state(), step=1),
         directory=PathArg(reads=False), step=Count(0), state=Tree(free=True, single_ok=False),
         same=anything),
    call(checkpoint.start_save, lambda: dict(directory=_fresh(), state=_state(), step=1),
         directory=PathArg(reads=False), step=Count(0), state=Tree(free=True, single_ok=False),
         same=lambda a, b: a.wait() and b.wait() and True),
    call(crash.killed_save, lambda: dict(directory=_fresh(), step=1, n_devices=8, timeout=60),
         directory=PathArg(reads=False, valid_forms=False), same=anything),
]

TREES = [
    call(anatomy.bytes_per_device, lambda: dict(tree=_state()), tree=Tree(free=True)),
    call(anatomy.state_bytes, lambda: dict(tree=_state()), tree=Tree(free=True)),
    call(anatomy.fits, lambda: dict(tree=_state(), chip="h200"), tree=Tree(free=True), chip=Choice()),
    call(anatomy.write_plan, lambda: dict(state=_state(), replica_parallel=True),
         state=Tree(free=True), replica_parallel=Flag(optional=True)),
    call(anatomy.written_pieces, lambda: dict(array=_state()["w"], replica_parallel=True),
         replica_parallel=Flag(optional=True)),
    call(training.state_like, dict(config=CONFIG, strategy="dp", n_devices=4),
         strategy=Choice(), n_devices=Count(maximum=8), same=anything),
    call(training.prepare, dict(config=CONFIG, strategy="dp", n_devices=4, batch=8),
         strategy=Choice(), n_devices=Count(maximum=8), batch=Count(), same=anything),
    call(training.train_lm, lambda: dict(config=CONFIG, strategy="dp", n_devices=2, steps=2,
                                         batch=4, seed=0, checkpoint_dir=_fresh(),
                                         save_every=1, resume=False),
         strategy=Choice(), n_devices=Count(maximum=8), steps=Count(), batch=Count(),
         seed=Count(0), save_every=Count(optional=True), resume=Flag(),
         checkpoint_dir=PathArg(reads=False)),
]

CALLS = READERS + WRITERS + TREES


CALLS += [
    call(anatomy.layouts, lambda: dict(tree=_state(), names=None), tree=Tree(free=True),
         same=anything),
]

QUICK = [c for c in READERS if c.label in ("checkpoint.latest_step", "anatomy.listing")]
test_every_guarded_argument, test_paths_quick = battery_tests(CALLS, QUICK)
