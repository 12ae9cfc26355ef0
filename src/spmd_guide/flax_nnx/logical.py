"""The Part IX transformer in Flax NNX, its strategies as tables of logical-axis rules.

Every parameter says what each of its dimensions *is* (``embed``, ``heads``, ``mlp``,
``vocab``, ...); a strategy is a table of rules from those logical names to mesh axes::

    model = create(config, strategy="fsdp_tp", mesh=mesh)   # built in its layout, under jit
    optimizer = make_optimizer(model)                        # AdamW, laid out like the params
    loss = train_step(model, optimizer, tokens, microbatches=4)

A rule table is resolved per array, dimension by dimension in order: a dimension takes the
first rule for its name whose mesh axes are not yet used by an earlier dimension of the same
array and whose size they divide; otherwise it stays whole. That is Part IX's layouts
exactly, ZeRO-3's "first dimension that divides" included (:func:`mesh_spec`).

Parameters are float32 (``param_dtype``); ``compute_dtype=jnp.bfloat16`` runs the matrix
products and activations in bfloat16 while the weights, their gradients and AdamW's moments
stay float32 (mixed precision). ``train_step(..., microbatches=k)`` accumulates the gradient
over ``k`` equal slices of the batch in a ``jax.lax.scan`` and makes one update, equal to the
update on the whole batch.

On a mesh of Explicit axes the model runs under ``jax.sharding.auto_axes`` (as Part IX's
strategies do): parameters, optimizer state and gradients keep their Explicit shardings.
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo
from spmd_guide.flax_nnx.layouts import (
    _auto,
    _check_mesh,
    _shardings,
    param_specs,
    set_abstract,
)
from spmd_guide.flax_nnx.rules import (
    ACTIVATION_NAMES,
    PARAM_NAMES,
    RULES,
    Rules,
    check_rules,
    mesh_spec,
    rules_of,
)
from spmd_guide.transformer import lm
from spmd_guide.transformer.attention import reference_attention

__all__ = ["GRADIENT_LAYOUTS", "RULES", "Model", "abstract_model", "check_concrete",
           "check_gradient_layout", "check_model", "create", "loss", "make_optimizer", "mesh_spec", "param_specs", "to_lm_params", "train_step"]

# --------------------------------------------------------------------------- the model


def _param(rngs: nnx.Rngs, names: tuple[str, ...], shape: tuple[int, ...], dtype: Any, *,
           fan_in: int | None = None, scale: float = 1.0) -> nnx.Param:
    """A parameter drawn as Part IX draws it (normal / sqrt(fan_in); ones for a norm),
    annotated with the logical names of its dimensions. ``eager_sharding=False``: Flax
    0.12 would otherwise lay it out as it is made, by its own renaming of the names; the
    book lays the whole state out at once with :func:`mesh_spec` (:func:`create`)."""
    if fan_in is None:
        init = nnx.initializers.ones
    else:
        def init(key, shape, dtype):
            return jax.random.normal(key, shape, dtype) * (scale / math.sqrt(fan_in))
    return nnx.Param(nnx.with_partitioning(init, names)(rngs.params(), shape, dtype),
                     eager_sharding=False)


class Block(nnx.Module):
    """One pre-norm block: RMS norm, causal multi-head attention, RMS norm, GELU MLP."""

    def __init__(self, config: lm.Config, rngs: nnx.Rngs, dtype: Any):
        c, n = config, PARAM_NAMES
        qkv = (c.d_model, c.n_heads, c.head_dim)
        self.norm1 = _param(rngs, n["norm1"], (c.d_model,), dtype)
        self.wq = _param(rngs, n["wq"], qkv, dtype, fan_in=c.d_model)
        self.wk = _param(rngs, n["wk"], qkv, dtype, fan_in=c.d_model)
        self.wv = _param(rngs, n["wv"], qkv, dtype, fan_in=c.d_model)
        self.wo = _param(rngs, n["wo"], (c.n_heads, c.head_dim, c.d_model), dtype,
                         fan_in=c.d_model)
        self.norm2 = _param(rngs, n["norm2"], (c.d_model,), dtype)
        self.w_up = _param(rngs, n["w_up"], (c.d_model, c.d_ff), dtype, fan_in=c.d_model)
        self.w_down = _param(rngs, n["w_down"], (c.d_ff, c.d_model), dtype, fan_in=c.d_ff)

    def __call__(self, x: jax.Array, model: Model) -> jax.Array:
        w = model._weight
        h = _rms_norm(x, w(self.norm1))
        q, k, v = (model._constrain(jnp.einsum("bsd,dhk->bshk", h, w(p)), "heads")
                   for p in (self.wq, self.wk, self.wv))
        a = model._constrain(reference_attention(q, k, v, causal=True), "heads")
        x = model._constrain(x + jnp.einsum("bshk,hkd->bsd", a, w(self.wo)), "residual")
        h = _rms_norm(x, w(self.norm2))
        u = model._constrain(jax.nn.gelu(h @ w(self.w_up)), "hidden")
        return model._constrain(x + u @ w(self.w_down), "residual")


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """Part IX's RMS norm, its mean of squares taken in float32 in any compute dtype."""
    x32 = x.astype(jnp.float32)
    norm = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return norm.astype(x.dtype) * scale


class Model(nnx.Module):
    """The Part IX transformer (:mod:`spmd_guide.transformer.lm`) as an ``nnx.Module``.

    Parameters are ``param_dtype``; with a ``compute_dtype`` (e.g. ``jnp.bfloat16``) every
    weight is cast to it where it is used, so activations and matrix products run in it;
    norms and the loss are computed in float32. ``Model(config, rngs=nnx.Rngs(0))`` is the
    one-device model; :func:`create` builds it sharded on a mesh.
    """

    def __init__(self, config: lm.Config, *, rngs: nnx.Rngs, param_dtype: Any = jnp.float32,
                 compute_dtype: Any = None):
        config = lm.check_config(config)
        if not isinstance(rngs, nnx.Rngs):
            raise checks.InputTypeError(
                f"rngs must be an nnx.Rngs such as nnx.Rngs(0), got {checks.value_text(rngs)}.")
        c, n = config, PARAM_NAMES
        dtype = _float_dtype("param_dtype", param_dtype)
        self.config = config
        self.compute_dtype = None if compute_dtype is None else \
            _float_dtype("compute_dtype", compute_dtype)
        self.mesh: Mesh | None = None      # set by create(): where activations are pinned
        self.rules: Rules | None = None
        self.embed = _param(rngs, n["embed"], (c.vocab, c.d_model), dtype, fan_in=1)
        self.pos = _param(rngs, n["pos"], (c.seq_len, c.d_model), dtype, fan_in=1, scale=0.1)
        self.blocks = nnx.List([Block(c, rngs, dtype) for _ in range(c.n_layers)])
        self.norm_f = _param(rngs, n["norm_f"], (c.d_model,), dtype)
        self.unembed = _param(rngs, n["unembed"], (c.d_model, c.vocab), dtype, fan_in=c.d_model)

    def _weight(self, p: nnx.Param) -> jax.Array:
        value = p[...]
        return value if self.compute_dtype is None else value.astype(self.compute_dtype)

    def _constrain(self, x: jax.Array, kind: str) -> jax.Array:
        """Pin an activation's layout by its logical names (nothing without a mesh)."""
        if self.mesh is None or self.rules is None:
            return x
        spec = mesh_spec(ACTIVATION_NAMES[kind], x.shape, self.rules, self.mesh,
                         skip_indivisible=False)
        return jax.lax.with_sharding_constraint(x, NamedSharding(_auto(self.mesh), spec))

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Float32 logits ``[batch, seq, vocab]`` for int tokens ``[batch, seq]``."""
        seq = inputs.shape[1]
        x = self._weight(self.embed)[inputs] + self._weight(self.pos)[:seq]
        x = self._constrain(x, "residual")
        for block in self.blocks:
            x = block(x, self)
        x = _rms_norm(x, self._weight(self.norm_f))
        return self._constrain((x @ self._weight(self.unembed)).astype(jnp.float32), "logits")


def _float_dtype(name: str, value: Any) -> np.dtype:
    """A floating dtype; ``None`` is refused (``jnp.dtype(None)`` would be float64, then
    float32 without x64: not what a caller who passed nothing meant)."""
    try:
        dtype = None if value is None else jnp.dtype(value)
    except TypeError:
        dtype = None
    if isinstance(value, bool) or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise checks.InputTypeError(
            f"{name} must be a floating dtype such as jnp.float32 or jnp.bfloat16, got "
            f"{checks.value_text(value)}.")
    return dtype


def check_model(model: Any) -> Model:
    """``model`` if it is a :class:`Model` (every function of this subpackage takes one)."""
    return checks.instance("model", model, Model,
                           example="a spmd_guide.flax_nnx.logical.Model (from create or Model(...))")


def check_concrete(model: Model, *, name: str = "model") -> Model:
    """``model`` if its parameters hold values: :func:`abstract_model`'s hold only shapes
    (``jax.ShapeDtypeStruct``), so it can be compiled against or restored into, not run."""
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(model))):
        raise checks.InputError(
            f"{name} is abstract (abstract_model: its parameters are shapes, without values); "
            f"build it with create(...), or restore values into it with saving.restore.")
    return model


def create(config: lm.Config, *, strategy: str, mesh: Mesh, seed: int = 0,
           param_dtype: Any = jnp.float32, compute_dtype: Any = None) -> Model:
    """The model built under ``jax.jit`` directly in ``RULES[strategy]``'s layout on
    ``mesh`` (Auto or Explicit axes): no device ever holds a full copy it does not keep."""
    config = lm.check_config(config)
    rules = rules_of(strategy)
    mesh = _check_mesh(mesh)
    check_rules(rules, mesh)
    seed = checks.count("seed", seed, minimum=0, maximum=2**63 - 1)
    _float_dtype("param_dtype", param_dtype)
    if compute_dtype is not None:
        _float_dtype("compute_dtype", compute_dtype)
    _check_sizes(strategy, config, mesh)

    program, graphdef = _init_program(config, rules, mesh, jnp.dtype(param_dtype).name,
                                      None if compute_dtype is None else
                                      jnp.dtype(compute_dtype).name)
    model = nnx.merge(graphdef, program(jax.random.key(seed)))
    model.mesh, model.rules = mesh, rules
    return model


def abstract_model(config: lm.Config, *, strategy: str, mesh: Mesh,
                   param_dtype: Any = jnp.float32, compute_dtype: Any = None) -> Model:
    """The model :func:`create` would build, with ``jax.ShapeDtypeStruct`` parameters that
    carry their shardings: nothing is initialised or allocated. Compile against it, or
    restore a checkpoint into it (Flax's ``nnx.get_abstract_model`` does the same with its
    own resolution of the names)."""
    config = lm.check_config(config)
    rules = rules_of(strategy)
    mesh = _check_mesh(mesh)
    check_rules(rules, mesh)
    _check_sizes(strategy, config, mesh)
    model = nnx.eval_shape(lambda: Model(config, rngs=nnx.Rngs(0), param_dtype=param_dtype,
                                         compute_dtype=compute_dtype))
    set_abstract(nnx.state(model), rules, mesh)
    model.mesh, model.rules = mesh, rules
    return model


@functools.lru_cache(maxsize=32)
def _init_program(config: lm.Config, rules: Rules, mesh: Mesh, param_dtype: str,
                  compute_dtype: str | None) -> tuple[Any, Any]:
    """The model's initialisation compiled under ``jax.jit`` with every parameter's sharding
    as its output sharding, so the compiler draws each shard where it will live; and the
    model's graph. One compile per config, table and mesh (the key is an argument), without
    LLVM's code optimisation (a program run once: compile time is all that counts)."""

    def make(key):
        return Model(config, rngs=nnx.Rngs(key), param_dtype=param_dtype,
                     compute_dtype=compute_dtype)

    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    graphdef, abstract = nnx.split(nnx.eval_shape(make, key))
    init = jax.jit(lambda k: nnx.state(make(k)), out_shardings=_shardings(abstract, rules, mesh))
    return init.lower(key).compile(compiler_options=hlo.FAST_COMPILE), graphdef


def _check_sizes(strategy: str, config: lm.Config, mesh: Mesh) -> None:
    """Part IX refuses tensor parallelism over sizes that do not split: so does this."""
    for name, what in (("heads", "n_heads"), ("mlp", "d_ff"), ("vocab", "vocab")):
        for logical, target in RULES[strategy]:
            if logical == name and target == "model" and "model" in mesh.shape:
                checks.divisible(f"config.{what}", getattr(config, what),
                                 int(mesh.shape["model"]), why="over mesh axis 'model'")


def to_lm_params(model: Model) -> lm.Params:
    """The model's weights as Part IX's pytree (``lm.init_params``'s structure), the same
    arrays (same shardings), cast to nothing."""
    model = check_model(model)

    def block(b: Block) -> dict[str, jax.Array]:
        return {k: getattr(b, k).get_value() for k in ("norm1", "wq", "wk", "wv", "wo", "norm2",
                                               "w_up", "w_down")}

    return {"embed": model.embed.get_value(), "pos": model.pos.get_value(),
            "blocks": [block(b) for b in model.blocks], "norm_f": model.norm_f.get_value(),
            "unembed": model.unembed.get_value()}


# --------------------------------------------------------------------------- loss and training


def _check_tokens(model: Model, tokens: Any, microbatches: int = 1) -> Any:
    tokens = lm.check_tokens(tokens, model.config)
    batch = int(tokens.shape[0])
    checks.divisible("the batch (tokens.shape[0])", batch, microbatches,
                     why=f"for microbatches={microbatches}")
    return tokens


def _pure_loss(graphdef: Any, state: Any, tokens: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, state)
    logits = model(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def _explicit(mesh: Mesh | None) -> bool:
    return mesh is not None and not all(t == AxisType.Auto for t in mesh.axis_types)


@functools.partial(jax.jit, static_argnums=0, compiler_options=hlo.FAST_COMPILE)
def _loss_program(graphdef: Any, state: Any, tokens: jax.Array) -> jax.Array:
    mesh = nnx.merge(graphdef, state).mesh
    f = functools.partial(_pure_loss, graphdef)
    if _explicit(mesh):  # the model pins activations with sharding constraints: Auto only
        f = jax.sharding.auto_axes(f, out_sharding=NamedSharding(mesh, P()))
    return f(state, tokens)


def loss(model: Model, tokens: Any) -> jax.Array:
    """Mean next-token cross-entropy of ``tokens`` ``[batch, seq_len + 1]``; equals
    ``lm.lm_loss(to_lm_params(model), tokens, config=model.config)`` (in float32 compute)."""
    model = check_concrete(check_model(model))
    tokens = _check_tokens(model, tokens)
    graphdef, state = nnx.split(model)
    return _loss_program(graphdef, state, _place_tokens(model, tokens))


def _place_tokens(model: Model, tokens: Any) -> jax.Array:
    """Tokens laid out as the rules lay out ``batch`` (whole if it does not divide)."""
    if model.mesh is None:
        return jnp.asarray(tokens)
    spec = mesh_spec(("batch", "length"), tokens.shape, model.rules, model.mesh,
                     skip_indivisible=False)
    tokens = np.asarray(tokens) if not isinstance(tokens, jax.Array) else tokens
    return jax.device_put(tokens, NamedSharding(model.mesh, spec))


#: Where ``train_step`` keeps the gradient (``make_optimizer(..., gradient_layout=...)``):
#: in the parameters' layout, or in the optimizer state's (ZeRO-2 under a split state).
GRADIENT_LAYOUTS = ("params", "state")


def check_gradient_layout(gradient_layout: Any) -> str:
    """``gradient_layout`` if it is one of :data:`GRADIENT_LAYOUTS`."""
    return checks.one_of("gradient_layout", gradient_layout, GRADIENT_LAYOUTS)


def make_optimizer(model: Model, *, learning_rate: float = 1e-3,
                   state_strategy: str | None = None,
                   gradient_layout: str = "params") -> nnx.Optimizer:
    """``nnx.Optimizer`` with optax AdamW over the model's ``nnx.Param``s, its moments made
    under ``jax.jit`` in the parameters' layouts (ZeRO-3 keeps them split like the weights).

    ``state_strategy`` lays the moments out by another table, ``RULES[state_strategy]``, on the
    model's mesh: ``make_optimizer(<a 'dp' model>, state_strategy='fsdp')`` is ZeRO-1 (the
    moments split over ``data``, the parameters whole). :func:`train_step` keeps both layouts.

    ``gradient_layout`` says where :func:`train_step` keeps the gradient between the backward
    pass and the update: ``'params'`` (the parameters' layout: whole under ``dp``, so every
    device holds all of it) or ``'state'`` (the optimizer state's layout: with
    ``state_strategy='fsdp'`` each device keeps only its slice of the reduced gradient,
    ZeRO-2). The two give the same update.
    """
    model = check_concrete(check_model(model))
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    gradient_layout = check_gradient_layout(gradient_layout)
    tx = _adamw(learning_rate)
    if model.mesh is None:
        if state_strategy is not None:
            raise checks.InputError(
                "state_strategy lays the optimizer state out on the model's mesh, and this "
                "model has none; build it with create(..., mesh=...).")
        return _owned(nnx.Optimizer(model, tx, wrt=nnx.Param), model)
    state_grads = gradient_layout == "state"
    rules = model.rules if state_strategy is None else check_rules(rules_of(state_strategy),
                                                                   model.mesh)
    graphdef, state = nnx.split(model)
    key = (graphdef, tx, rules, state_grads)
    if key not in _OPTIMIZER_PROGRAMS:  # one compile per model graph, learning rate, table

        def make(state):
            optimizer = nnx.Optimizer(nnx.merge(graphdef, state), tx, wrt=nnx.Param)
            optimizer.state_rules = rules  # static: train_step keeps the state in it
            optimizer.state_grads = state_grads  # static: and the gradient in it (ZeRO-2)
            return optimizer

        opt_graphdef, abstract = nnx.split(nnx.eval_shape(make, state))
        init = jax.jit(lambda s: nnx.state(make(s)),
                       out_shardings=_shardings(abstract, rules, model.mesh),
                       compiler_options=hlo.FAST_COMPILE)
        _OPTIMIZER_PROGRAMS[key] = (init, opt_graphdef)
    init, opt_graphdef = _OPTIMIZER_PROGRAMS[key]
    return _owned(nnx.merge(opt_graphdef, init(state)), model)


#: Which model each optimizer from make_optimizer was made for: Flax 0.12's nnx.Optimizer no
#: longer holds its model, and another model of the same shapes would silently take its moments.
_OWNERS: weakref.WeakKeyDictionary[nnx.Optimizer, weakref.ref[Model]] = weakref.WeakKeyDictionary()


def _owned(optimizer: nnx.Optimizer, model: Model) -> nnx.Optimizer:
    _OWNERS[optimizer] = weakref.ref(model)
    return optimizer


_OPTIMIZER_PROGRAMS: dict[Any, Any] = {}


@functools.lru_cache(maxsize=16)
def _adamw(learning_rate: float) -> optax.GradientTransformation:
    """One AdamW per learning rate: the optimizer's graph holds it, so equal learning rates
    give equal graphs and ``train_step`` compiles once for them."""
    return optax.adamw(learning_rate)


def grads_fn(graphdef: Any, microbatches: int, *, mesh: Mesh | None = None,
             rules: Rules | None = None) -> Any:
    """``f(state, tokens) -> (loss, grads)``: the mean loss and its gradient, accumulated
    over ``microbatches`` equal slices of the batch in a ``jax.lax.scan``. Slice ``j`` takes
    rows ``j, j + k, j + 2k, ...``, so each slice is spread over the devices as the batch is.
    With a ``mesh`` (Auto axes) and ``rules``, the slices, the running sum and the gradients
    are pinned to the layouts the rules give them (each gradient its parameter's)."""
    value_and_grad = jax.value_and_grad(functools.partial(_pure_loss, graphdef))
    k = microbatches

    def pin(tree, shardings):
        return tree if mesh is None else jax.lax.with_sharding_constraint(tree, shardings)

    def f(state, tokens):
        layouts = None if mesh is None else _shardings(state, rules, mesh)
        if k == 1:
            value, grads = value_and_grad(state, tokens)
            return value, pin(grads, layouts)
        slices = tokens.reshape(tokens.shape[0] // k, k, -1).swapaxes(0, 1)
        if mesh is not None:
            batch = mesh_spec(("batch", "length"), slices.shape[1:], rules, mesh,
                              skip_indivisible=False)
            slices = pin(slices, NamedSharding(mesh, P(None, *batch)))

        def body(carry, mb):
            total, acc = carry
            value, grads = value_and_grad(state, mb)
            return (total + value, pin(jax.tree.map(jnp.add, acc, grads), layouts)), None

        zeros = pin(jax.tree.map(jnp.zeros_like, state), layouts)
        (total, acc), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), slices)
        return total / k, jax.tree.map(lambda g: g / k, acc)

    return f


def _grads(graphdef: Any, state: Any, tokens: jax.Array, microbatches: int,
           rules: Rules | None = None) -> Any:
    """:func:`grads_fn` on the model's mesh: under ``auto_axes`` on Explicit axes, with the
    loss replicated and each gradient in its parameter's layout, or in the layout ``rules``
    give it (the optimizer state's, under ZeRO-2: each device keeps its slice of the sum)."""
    model = nnx.merge(graphdef, state)
    if model.mesh is None:
        return grads_fn(graphdef, microbatches)(state, tokens)
    rules = rules or model.rules
    f = grads_fn(graphdef, microbatches, mesh=_auto(model.mesh), rules=rules)
    if _explicit(model.mesh):
        out = (NamedSharding(model.mesh, P()), _shardings(state, rules, model.mesh))
        f = jax.sharding.auto_axes(f, out_sharding=out)
    return f(state, tokens)


# No donate_argnums: donating the state would free arrays that other live objects may share
# (a model from nnx.clone, a to_lm_params tree taken before the step), see train_step.
@functools.partial(jax.jit, static_argnums=(0, 1, 4), compiler_options=hlo.FAST_COMPILE)
def _step_program(graphdef: Any, opt_graphdef: Any, state: Any, opt_state: Any,
                  microbatches: int, tokens: jax.Array) -> tuple[Any, Any, jax.Array]:
    model = nnx.merge(graphdef, state)
    update = functools.partial(_update, graphdef, opt_graphdef)
    if model.mesh is None:
        value, grads = _grads(graphdef, state, tokens, microbatches)
        return *update(state, opt_state, grads), value
    # Each state keeps its table's layout: the parameters the model's, the optimizer state
    # its own. Under ZeRO-1 (another table) the gradients come in the parameters' layout and
    # the update gives the moments' slices; under ZeRO-2 (gradient_layout='state') the
    # gradients come in the moments' layout, pinned there, so each device keeps its slice
    # of the sum. Either way the new parameters are laid back out in theirs.
    optimizer = nnx.merge(opt_graphdef, opt_state)
    rules = getattr(optimizer, "state_rules", None) or model.rules
    grad_rules = rules if getattr(optimizer, "state_grads", False) else model.rules
    value, grads = _grads(graphdef, state, tokens, microbatches, grad_rules)
    out = (_shardings(state, model.rules, model.mesh),
           _shardings(opt_state, rules, model.mesh))
    if _explicit(model.mesh):
        return *jax.sharding.auto_axes(update, out_sharding=out)(state, opt_state, grads), value
    auto = jax.tree.map(lambda s: NamedSharding(_auto(model.mesh), s.spec), out)
    return *jax.lax.with_sharding_constraint(update(state, opt_state, grads), auto), value


def _update(graphdef: Any, opt_graphdef: Any, state: Any, opt_state: Any,
            grads: Any) -> tuple[Any, Any]:
    model, optimizer = nnx.merge(graphdef, state), nnx.merge(opt_graphdef, opt_state)
    optimizer.update(model, grads)
    return nnx.state(model), nnx.state(optimizer)


def train_step(model: Model, optimizer: nnx.Optimizer, tokens: Any, *,
               microbatches: int = 1) -> jax.Array:
    """One AdamW update of ``model`` and ``optimizer`` in place on ``tokens``; the mean loss
    before the update. ``microbatches=k`` accumulates the gradient over ``k`` equal slices
    of the batch and gives the same update as the whole batch at once.

    The step does not donate its inputs: the model's and the optimizer's variables then point
    at new arrays, and the old ones stay valid for whoever else holds them (a model from
    ``nnx.clone``, which shares its arrays, or a ``to_lm_params(model)`` tree taken before the
    step); they are freed when the last reference goes. Donation (``donate_argnums``) would
    reuse their memory for the update but delete them under every other holder. The price:
    while the update runs, a device holds the old and the new parameters and AdamW state."""
    model = check_concrete(check_model(model))
    if not isinstance(optimizer, nnx.Optimizer):
        raise checks.InputTypeError(
            f"optimizer must be the nnx.Optimizer make_optimizer(model) returns, got "
            f"{checks.value_text(optimizer)}.")
    microbatches = checks.count("microbatches", microbatches)
    tokens = _check_tokens(model, tokens, microbatches)
    graphdef, state = nnx.split(model)
    opt_graphdef, opt_state = nnx.split(optimizer)
    _check_optimizer(state, opt_state)
    owner = _OWNERS.get(optimizer)
    if owner is not None and owner() is not model:
        raise checks.InputError(
            "optimizer was made for another model (its AdamW moments are that model's); make "
            "one with make_optimizer(model) for this model.")
    new_state, new_opt, value = _step_program(graphdef, opt_graphdef, state, opt_state,
                                              microbatches, _place_tokens(model, tokens))
    nnx.update(model, new_state)
    nnx.update(optimizer, new_opt)
    return value


def _check_optimizer(state: Any, opt_state: Any) -> None:
    """The optimizer must track this model's parameters (same shapes)."""
    params = [tuple(x.shape) for x in jax.tree.leaves(state)]
    mu = opt_state.get("opt_state") if hasattr(opt_state, "get") else None
    moments = [tuple(x.shape) for x in jax.tree.leaves(mu)] if mu is not None else []
    if not moments or any(tuple(s) not in set(params) for s in moments if s):
        raise checks.InputError(
            "optimizer does not track this model's parameters; make it with "
            "make_optimizer(model) for this model.")
