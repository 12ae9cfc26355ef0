"""Train the Part IX transformer so that the run can be stopped and moved.

:func:`train_lm` trains :mod:`spmd_guide.transformer.lm`'s model on its counting task with
AdamW (optax) under one of :data:`spmd_guide.transformer.transformer.STRATEGIES`, reading the
data with the book's own loader (:func:`spmd_guide.randomness.data.sharded_batches`). With a
``checkpoint_dir`` it saves everything the run needs to go on, as one pytree::

    {"params": ..., "opt_state": ..., "data": {"seed", "epoch", "position", "batch", "examples"}}

The parameters and the optimizer state are sharded arrays, written as they lie; the data's
place is five integers, because the loader's order is a function of ``(seed, epoch)`` alone,
not of the layout. ``resume=True`` restores the latest complete step laid out for the strategy
and devices given *now*, so a run saved under ``fsdp_tp`` on 8 devices continues under ``tp``
on 4 with the same data order and optimizer state, and the same losses up to float rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.checkpointing import checkpoint
from spmd_guide.core import checks, hlo
from spmd_guide.randomness import data
from spmd_guide.transformer import lm, transformer

__all__ = ["EXAMPLES", "LEARNING_RATE", "Run", "abstract_state", "prepare", "state_like",
           "train_lm"]

#: The counting-task examples of one epoch (a fixed dataset drawn from the seed).
EXAMPLES = 256
#: AdamW's learning rate (lm.optimizer's default).
LEARNING_RATE = 3e-3
#: The integers that say where the data stands (saved as int32 scalars).
DATA_FIELDS = ("seed", "epoch", "position", "batch", "examples")
#: The largest value an int32 data field holds: seed, batch and examples are checked
#: against it before training, so the save at the end cannot fail.
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Run:
    """A strategy on the first ``n_devices`` devices, compiled once: its mesh, the layouts
    of parameters, optimizer state and tokens, and the compiled pieces of a training step."""

    strategy: transformer.Strategy
    mesh: Mesh
    init: Any          # key -> (params, opt_state), laid out
    step: Any          # compiled: (params, opt_state, tokens) -> (params, opt_state, loss)
    token_sharding: NamedSharding
    params: Any        # jax.ShapeDtypeStruct leaves with the strategy's shardings
    opt_state: Any     # the same for AdamW's state


def _check_config(config: Any) -> lm.Config:
    if not isinstance(config, lm.Config):
        raise checks.InputTypeError(
            f"config must be a spmd_guide.transformer.lm.Config, got {checks.value_text(config)}.")
    return config


def prepare(config: lm.Config, *, strategy: str, n_devices: int, batch: int) -> Run:
    """Check that ``strategy`` can split the model and a batch of ``batch`` sequences on the
    first ``n_devices`` devices, and compile its training step (once per strategy, device
    count and config in a process). Raises before anything runs or touches the disk."""
    return _prepare(*_check_run(config, strategy, n_devices, batch))


def _check_run(config: Any, strategy: Any, n_devices: Any, batch: Any
               ) -> tuple[lm.Config, str, int, int]:
    """The arguments of a run, checked: the strategy splits the model and a batch of
    ``batch`` sequences on the first ``n_devices`` devices (nothing compiled)."""
    config = _check_config(config)
    name = checks.one_of("strategy", strategy, transformer.STRATEGIES)
    n_devices = checks.count("n_devices", n_devices, maximum=len(jax.devices()))
    batch = checks.count("batch", batch, maximum=INT32_MAX)  # saved as int32
    strategy_, mesh, _ = _layout(config, name, n_devices)
    checks.spec_fits("a batch of tokens", (batch, config.seq_len + 1), strategy_.token_spec(),
                     mesh)
    return config, name, n_devices, batch


@functools.cache
def _shapes(config: lm.Config) -> Any:
    """The parameters' shapes and dtypes as ``jax.ShapeDtypeStruct`` (nothing allocated)."""
    return jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape, np.dtype(config.dtype)),
                        lm.param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))


@functools.cache
def _layout(config: lm.Config, name: str, n_devices: int) -> tuple[transformer.Strategy, Mesh,
                                                                     Any]:
    """The strategy, its mesh on the first ``n_devices`` devices and the parameters' shapes,
    checked: every size the strategy splits divides by the mesh axis that splits it."""
    strategy = transformer.STRATEGIES[name]
    mesh = strategy.mesh(jax.devices()[:n_devices])
    strategy.check(config, mesh)
    shapes = _shapes(config)
    for (path, leaf), spec in zip(jax.tree_util.tree_leaves_with_path(shapes),
                                  jax.tree.leaves(strategy.param_specs(shapes, mesh)),
                                  strict=True):
        checks.spec_fits(f"params{jax.tree_util.keystr(path)}", leaf.shape, spec, mesh)
    return strategy, mesh, shapes


def state_like(config: lm.Config, *, strategy: str, n_devices: int) -> Any:
    """What a training checkpoint holds, as ``jax.ShapeDtypeStruct`` leaves laid out as
    ``strategy`` lays them on the first ``n_devices`` devices: the ``like`` of
    :func:`spmd_guide.checkpointing.checkpoint.restore`. Nothing is compiled or allocated,
    so it works for a model far larger than this machine's memory."""
    config = _check_config(config)
    name = checks.one_of("strategy", strategy, transformer.STRATEGIES)
    n_devices = checks.count("n_devices", n_devices, maximum=len(jax.devices()))
    strategy_, mesh, shapes = _layout(config, name, n_devices)
    p_sh = strategy_.shardings(shapes, mesh)
    opt = jax.eval_shape(lm.optimizer(LEARNING_RATE).init, shapes)
    s_sh = transformer.state_shardings(opt, shapes, p_sh, mesh)
    return _state(mesh, _with_shardings(shapes, p_sh), _with_shardings(opt, s_sh))


def _state(mesh: Mesh, params: Any, opt_state: Any) -> Any:
    scalar = jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))
    return {"params": params, "opt_state": opt_state,
            "data": dict.fromkeys(DATA_FIELDS, scalar)}


@functools.cache
def _prepare(config: lm.Config, name: str, n_devices: int, batch: int) -> Run:
    strategy, mesh, shapes = _layout(config, name, n_devices)
    token_spec = strategy.token_spec()
    optimizer = lm.optimizer(LEARNING_RATE)
    trainer = transformer.train_step(strategy, mesh, config, shapes, optimizer=optimizer)
    params = _with_shardings(shapes, trainer.param_shardings)
    opt_state = _with_shardings(jax.eval_shape(trainer.init, params), trainer.state_shardings)
    token_sharding = NamedSharding(mesh, token_spec)
    tokens = jax.ShapeDtypeStruct((batch, config.seq_len + 1), np.int32, sharding=token_sharding)

    def init(key):
        # lm's own init program on one device, placed from the host (a plain copy per
        # device), then AdamW's state made in its layout
        params = lm.init_params(key, config)
        params = jax.device_put(jax.tree.map(np.asarray, params), trainer.param_shardings)
        return params, trainer.init(params)

    # The step is compiled here, once, without LLVM's code optimisation (hlo.FAST_COMPILE:
    # the same HLO and numbers; these programs are tiny and run a few times).
    step = hlo.compile(trainer.step, params, opt_state, tokens,
                       compiler_options=hlo.FAST_COMPILE)
    return Run(strategy=strategy, mesh=mesh, init=init, step=step,
               token_sharding=token_sharding, params=params, opt_state=opt_state)


def _with_shardings(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def abstract_state(run: Run) -> Any:
    """:func:`state_like` for a prepared run."""
    if not isinstance(run, Run):
        raise checks.InputTypeError(
            f"run must be a Run from prepare(config, strategy=..., n_devices=..., batch=...), "
            f"got {checks.value_text(run)}.")
    return _state(run.mesh, run.params, run.opt_state)


@functools.cache
def _dataset(config: lm.Config, seed: int, examples: int) -> np.ndarray:
    """The fixed dataset of one seed: ``examples`` counting sequences, on the host."""
    key = jax.random.fold_in(jax.random.key(seed), 1)
    return np.asarray(lm.counting_task(key, batch=examples, config=config))


def _batches(config: lm.Config, run: Run, *, seed: int, epoch: int, batch: int,
             examples: int) -> data.Batches:
    return data.sharded_batches(_dataset(config, seed, examples), batch, run.token_sharding,
                                seed=seed, epoch=epoch, drop_remainder=True)


def _position(values: dict[str, Any]) -> dict[str, int]:
    return {k: int(values[k]) for k in DATA_FIELDS}


def _check_resume(found: dict[str, int], asked: dict[str, int], where: str) -> None:
    for name in ("seed", "batch", "examples"):
        if found[name] != asked[name]:
            raise checks.InputError(
                f"{where} was trained with {name}={found[name]}, but this call asks for "
                f"{name}={asked[name]}: a resumed run must read the same data in the same "
                f"order. Pass {name}={found[name]}.")


def train_lm(config: lm.Config, *, strategy: str, n_devices: int, steps: int, batch: int,
             seed: int = 0, checkpoint_dir: Any = None, save_every: int | None = None,
             resume: bool = False, examples: int = EXAMPLES) -> list[float]:
    """Train under ``strategy`` on the first ``n_devices`` devices for ``steps`` steps; the
    loss of each step run.

    With ``checkpoint_dir`` the run saves a complete step every ``save_every`` steps (counted
    from the start of training, so a resumed run keeps the schedule) and after its last step;
    each save is written in the background while the next steps run. ``resume=True``
    continues from the latest complete step in ``checkpoint_dir`` (parameters, optimizer
    state and data position), laid out for the strategy and device count given now.
    ``examples`` is the size of the dataset (an epoch; a last partial batch is dropped).
    """
    steps = checks.count("steps", steps, maximum=INT32_MAX)
    seed = checks.count("seed", seed, minimum=0, maximum=INT32_MAX)  # saved as int32
    examples = checks.count("examples", examples, maximum=INT32_MAX)
    resume = checks.flag("resume", resume)
    if save_every is not None:
        save_every = checks.count("save_every", save_every)
    config, name, n_devices, batch = _check_run(config, strategy, n_devices, batch)
    if batch > examples:
        raise checks.InputError(
            f"batch={batch} is more than examples={examples}: an epoch would hold no full "
            f"batch. Use a batch of at most {examples}, or more examples.")
    if checkpoint_dir is None:
        if resume or save_every is not None:
            raise checks.InputError(
                f"{'resume=True' if resume else 'save_every'} needs a checkpoint_dir.")
    else:
        checkpoint_dir = checkpoint._directory(checkpoint_dir, must_exist=False,
                                               name="checkpoint_dir")
        done = checkpoint.steps(checkpoint_dir)
        half = [n for n in checkpoint._unfinished(checkpoint_dir) if n.isdigit()]
        if half:
            raise checks.InputError(
                f"checkpoint_dir {str(checkpoint_dir)!r} holds step directories that are not "
                f"complete ({half}: no {checkpoint.COMMIT_MARKER}), which a save of that step "
                f"could not replace; delete them first.")
        if done and not resume:
            raise checks.InputError(
                f"checkpoint_dir {str(checkpoint_dir)!r} already holds steps {done}: pass "
                f"resume=True to continue that run, or give an empty directory.")
    asked = {"seed": seed, "batch": batch, "examples": examples}

    if resume:  # restored and checked before anything is compiled
        start = checkpoint.latest_step(checkpoint_dir)
        if start is None:
            raise checks.InputError(
                f"resume=True, but checkpoint_dir {str(checkpoint_dir)!r} holds no complete "
                f"checkpoint to resume from.")
        state = checkpoint.restore(checkpoint_dir, step=start, like=state_like(
            config, strategy=name, n_devices=n_devices))
        where = _position(state["data"])
        _check_resume(where, asked, f"step {start} of {str(checkpoint_dir)!r}")
        params, opt_state = state["params"], state["opt_state"]
        epoch, position = where["epoch"], where["position"]
        run = _prepare(config, name, n_devices, batch)
    else:
        run = _prepare(config, name, n_devices, batch)
        start, epoch, position = 0, 0, 0
        params, opt_state = run.init(jax.random.key(seed))

    batches = _batches(config, run, seed=seed, epoch=epoch, batch=batch,
                       examples=examples).skip(position)
    losses, pending = [], None
    try:
        for i in range(steps):
            if not len(batches):
                epoch += 1
                batches = _batches(config, run, seed=seed, epoch=epoch, batch=batch,
                                   examples=examples)
            params, opt_state, loss = run.step(params, opt_state, next(batches))
            losses.append(loss)
            step = start + i + 1
            if checkpoint_dir is not None and (i == steps - 1 or (
                    save_every is not None and step % save_every == 0)):
                if pending is not None:
                    pending.wait()
                where = asked | {"epoch": epoch, "position": batches.position}
                pending = checkpoint.start_save(
                    checkpoint_dir, {"params": params, "opt_state": opt_state,
                                     "data": {k: np.int32(where[k]) for k in DATA_FIELDS}},
                    step=step)
    finally:
        if pending is not None:
            pending.wait()
    return [float(x) for x in jax.device_get(losses)]


def max_abs_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest ``|a[i] - b[i]|`` of two loss curves of the same length (finite
    numbers: a NaN loss is refused, as it would hide any difference). Two empty curves are
    refused too: they have no difference to measure, and 0.0 would read as "identical"."""
    a = [checks.real(f"a[{i}]", x) for i, x in enumerate(_curve("a", a))]
    b = [checks.real(f"b[{i}]", x) for i, x in enumerate(_curve("b", b))]
    if len(a) != len(b):
        raise checks.InputError(f"the curves have {len(a)} and {len(b)} points; compare "
                                f"curves of the same length.")
    if not a:
        raise checks.InputError("a and b are empty: there is no loss to compare.")
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _curve(name: str, values: Any) -> list[Any]:
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, (Sequence, np.ndarray)):
        raise checks.InputTypeError(
            f"{name} must be a sequence of losses such as [2.7, 2.5], got {checks.value_text(values)}.")
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise checks.InputError(
            f"{name} must be one curve (1-D), got an array of shape {values.shape}.")
    return list(values)


def steps_per_epoch(*, batch: int, examples: int = EXAMPLES) -> int:
    """How many full batches one epoch holds (the loader drops a partial last batch)."""
    return checks.count("examples", examples) // checks.count("batch", batch)

