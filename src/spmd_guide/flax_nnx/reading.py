"""What the pages of Part XIII read from compiled programs: the NNX model's collectives next to
Part IX's, collectives inside and outside a gradient-accumulation loop, memory per device,
and a small program where JAX's ``unreduced`` sharding defers the gradient's reduction."""

from __future__ import annotations

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_guide.core import checks, hlo, hlo_text
from spmd_guide.flax_nnx import logical
from spmd_guide.transformer.transformer import STRATEGIES

__all__ = ["abstract_optimizer", "bytes_per_device", "collective_dtypes", "compare_with_part_ix", "deferred_reduction",
           "grad_program", "gradient", "init_memory", "loop_counts", "optimizer_costs", "partitioned_text", "step_program"]


def grad_program(model: logical.Model, tokens: Any, *, microbatches: int = 1) -> Any:
    """The compiled loss-and-gradient program of ``train_step`` (no update), on ``tokens``."""
    model = logical.check_model(model)
    microbatches = checks.count("microbatches", microbatches)
    tokens = logical._check_tokens(model, tokens, microbatches)
    graphdef, state = nnx.split(model)
    fn = jax.jit(functools.partial(logical._grads, graphdef, microbatches=microbatches))
    return hlo.compile(fn, state, logical._place_tokens(model, tokens),
                       compiler_options=hlo.FAST_COMPILE)


def gradient(model: logical.Model, tokens: Any, *, microbatches: int = 1) -> tuple[Any, Any]:
    """``train_step``'s mean loss and gradient on ``tokens`` (no update), the gradient in Part
    IX's pytree (:func:`logical.to_lm_params`'s structure)."""
    model = logical.check_concrete(logical.check_model(model))
    program = grad_program(model, tokens, microbatches=microbatches)
    graphdef, state = nnx.split(model)
    value, grads = program(state, logical._place_tokens(model, tokens))
    return value, logical.to_lm_params(nnx.merge(graphdef, grads))


def step_program(model: logical.Model, tokens: Any, *, microbatches: int = 1,
                 learning_rate: float = 1e-3, state_strategy: str | None = None,
                 gradient_layout: str = "params", dump_to: Any = None) -> Any:
    """The compiled program ``train_step`` runs (gradient and AdamW update), not run.
    ``model`` may be :func:`logical.abstract_model`'s: the optimizer state is then abstract
    too, each leaf with the sharding the model's table (or ``RULES[state_strategy]``, as in
    ``make_optimizer``) gives it, and nothing is allocated; ``gradient_layout`` as in
    ``make_optimizer`` (``'state'``: ZeRO-2). With ``dump_to`` (a directory),
    XLA writes the program as it leaves the SPMD partitioner there (:func:`partitioned_text`
    reads it)."""
    model = logical.check_model(model)
    microbatches = checks.count("microbatches", microbatches)
    tokens = logical._check_tokens(model, tokens, microbatches)
    optimizer = abstract_optimizer(model, learning_rate=learning_rate,
                                   state_strategy=state_strategy,
                                   gradient_layout=gradient_layout)
    options = {}
    if dump_to is not None:
        folder = checks.path("dump_to", dump_to, what="a path to a directory")
        options = {"xla_dump_to": str(folder), "xla_dump_hlo_pass_re": "spmd-partitioning"}
    graphdef, state = nnx.split(model)
    opt_graphdef, opt_state = nnx.split(optimizer)
    lowered = logical._step_program.lower(graphdef, opt_graphdef, state, opt_state,
                                          microbatches, logical._place_tokens(model, tokens))
    # hlo.compile, the book's one compile step: a compile that asks for a dump compiles
    # afresh, not from the persistent compile cache (a loaded program writes no dump).
    return hlo.compile(lowered, compiler_options=options or None)


def abstract_optimizer(model: logical.Model, *, learning_rate: float = 1e-3,
                       state_strategy: str | None = None,
                       gradient_layout: str = "params") -> Any:
    """The ``nnx.Optimizer`` :func:`logical.make_optimizer` would make, with
    ``jax.ShapeDtypeStruct`` values that carry their shardings: nothing is allocated."""
    model = logical.check_model(model)
    learning_rate = checks.real("learning_rate", learning_rate, positive=True)
    state_grads = logical.check_gradient_layout(gradient_layout) == "state"
    if model.mesh is None:
        if state_strategy is not None:
            raise checks.InputError("state_strategy needs a model on a mesh (create).")
        rules = None
    else:
        rules = model.rules if state_strategy is None else logical.check_rules(
            logical.rules_of(state_strategy), model.mesh)
    tx = logical._adamw(learning_rate)

    def make(m):
        optimizer = nnx.Optimizer(m, tx, wrt=nnx.Param)
        if rules is not None:
            optimizer.state_rules = rules
            optimizer.state_grads = state_grads
        return optimizer

    optimizer = nnx.eval_shape(make, model)
    if rules is not None:
        logical.set_abstract(nnx.state(optimizer), rules, model.mesh)
    return optimizer


def optimizer_costs(model: logical.Model, tokens: Any, *, state_strategy: str | None = None,
                    gradient_layout: str = "params") -> dict[str, Any]:
    """Per device, for AdamW's state laid out by the model's table or by
    ``RULES[state_strategy]`` (ZeRO-1: ``'fsdp'`` under a ``'dp'`` model; ZeRO-2 with
    ``gradient_layout='state'`` too): the bytes of the parameters and of the optimizer state
    a device holds, the collectives of the compiled step (counts by kind, bytes sent) and its
    temporaries (``memory_analysis()``'s ``temp_size_in_bytes``). Nothing is allocated for an
    abstract model."""
    optimizer = abstract_optimizer(model, state_strategy=state_strategy,
                                   gradient_layout=gradient_layout)
    program = step_program(model, tokens, state_strategy=state_strategy,
                           gradient_layout=gradient_layout)
    ops = hlo.collectives_in_text(program.as_text())
    return {"parameters": bytes_per_device(nnx.state(model, nnx.Param)),
            "optimizer state": bytes_per_device(nnx.state(optimizer)),
            "collectives": hlo.count_kinds(ops), "sent": sum(o.bytes_sent for o in ops),
            "temporaries": hlo.memory_per_device(program).temp_bytes}


def partitioned_text(folder: Any) -> str:
    """The HLO text of the program right after the SPMD partitioner, from the newest dump
    that :func:`step_program` wrote into ``folder`` (``dump_to``)."""
    root = checks.path("folder", folder, what="a path to a directory")
    found = sorted(root.glob("*after_spmd-partitioning*.txt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise checks.InputError(
            f"folder {str(root)!r} holds no dump of the SPMD partitioner's output; compile "
            f"with step_program(..., dump_to=folder) first.")
    return found[-1].read_text()


def collective_dtypes(program: Any) -> dict[str, int]:
    """Bytes one device sends per collective kind and element type (``"all-gather bf16"``)
    in a compiled program or its HLO text."""
    sent: dict[str, int] = {}
    for op in hlo.collectives_in_text(hlo_text.program_text(program)):
        dtype = op.dtype if isinstance(op.dtype, str) else "+".join(sorted(set(op.dtype)))
        key = f"{op.kind} {dtype}"
        sent[key] = sent.get(key, 0) + op.bytes_sent
    return dict(sorted(sent.items()))


def _part_ix_program(name: str, mesh: Any, config: Any, params: Any, tokens: Any) -> Any:
    """Part IX's loss-and-gradient program for ``params`` (arrays or shapes), compiled."""
    strategy = STRATEGIES[name]
    shardings = strategy.shardings(params, mesh)
    args = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                        params, shardings)
    placed = jax.device_put(np.asarray(tokens), NamedSharding(mesh, strategy.token_spec()))
    fn = jax.jit(jax.value_and_grad(strategy.loss(mesh, config)),
                 out_shardings=(NamedSharding(mesh, P()), shardings))
    return hlo.compile(fn, args, placed, compiler_options=hlo.FAST_COMPILE), args


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"


def compare_with_part_ix(config: Any, tokens: Any, meshes: dict[str, Any]) -> list[dict]:
    """One row per strategy: whether every parameter of the model :func:`logical.create`
    builds (its abstract twin, :func:`logical.abstract_model`: nothing is allocated) is laid
    out as Part IX's strategy lays it out, the collectives of both compiled
    loss-and-gradient programs, and whether they are the same ops (kinds, buffers and bytes
    sent). ``meshes`` maps strategy names to meshes."""
    if not isinstance(meshes, dict) or not meshes:
        raise checks.InputTypeError(
            f"meshes must be a dict from strategy names to meshes, got "
            f"{checks.value_text(meshes)}.")
    rows = []
    for name, mesh in meshes.items():
        model = logical.abstract_model(config, strategy=name, mesh=mesh)
        params = logical.to_lm_params(model)
        theirs, placed = _part_ix_program(name, mesh, config, params, tokens)
        same = all(a.sharding.is_equivalent_to(b.sharding, len(a.shape)) for a, b in zip(
            jax.tree.leaves(params), jax.tree.leaves(placed), strict=True))
        our_ops = hlo.collectives_in_text(grad_program(model, tokens).as_text())
        their_ops = hlo.collectives_in_text(theirs.as_text())
        ours, part8 = hlo.count_kinds(our_ops), hlo.count_kinds(their_ops)

        def sent(ops):  # every op's kind, buffers and bytes, in a canonical order
            return sorted((o.kind, o.shape_text, o.bytes_sent) for o in ops)
        rows.append({"strategy": name, "mesh": " x ".join(f"{k}={v}" for k, v in
                                                          mesh.shape.items()),
                     "same layout": same, "NNX + table": _counts_text(ours),
                     "Part IX": _counts_text(part8),
                     "same collectives": sent(our_ops) == sent(their_ops)})
    return rows


def loop_counts(program: Any) -> dict[str, dict[str, int]]:
    """Collectives of a compiled program split by where they run: ``"per microbatch"`` (in
    the body of a ``while`` loop, once per iteration) and ``"once"`` (everywhere else)."""
    text = hlo_text.program_text(program)
    module = hlo_text.parse_module(text)
    bodies: set[str] = set()
    for name in hlo_text.reachable(module):
        for instruction in module.computations[name]:
            if instruction.opcode == "while":
                body = re.search(r"body=%?([\w.\-]+)", instruction.attributes)
                if body:
                    sub = hlo_text.Module(module.computations, body.group(1),
                                          module.num_partitions, module.replica_count)
                    bodies |= set(hlo_text.reachable(sub))
    ops = hlo.collectives_in_text(text)
    return {"per microbatch": hlo.count_kinds(o for o in ops if o.computation in bodies),
            "once": hlo.count_kinds(o for o in ops if o.computation not in bodies)}


def deferred_reduction(mesh: Any, *, microbatches: int = 4, deferred: bool) -> dict[str, Any]:
    """Accumulate the gradient of a one-layer model over ``microbatches`` slices under data
    parallelism on ``mesh`` (one Explicit axis ``data``), and return the compiled program's
    collectives (:func:`loop_counts`) and the gradient's sum.

    ``deferred=True`` hands the loop the weight as ``P(reduced={'data'})``: its gradient then
    comes back *unreduced* (each device holds its own partial sum), the loop adds partial
    sums, and one ``jax.reshard`` to ``P()`` after the loop reduces them once. Otherwise each
    microbatch's gradient is all-reduced inside the loop."""
    checks.mesh("mesh", mesh)
    checks.axis(mesh, "data", name="mesh axis")
    if tuple(mesh.axis_names) != ("data",) or \
            any(t != jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        raise checks.InputError(
            f"deferred_reduction needs a mesh with one Explicit axis 'data', got "
            f"{dict(mesh.shape)} with {tuple(mesh.axis_types)}.")
    microbatches = checks.count("microbatches", microbatches)
    deferred = checks.flag("deferred", deferred)
    n = int(mesh.shape["data"])
    w = jax.device_put(jax.random.normal(jax.random.key(1), (16, 16)) / 4,
                       NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(jax.random.key(0), (microbatches, 4 * n, 16)),
                       NamedSharding(mesh, P(None, "data", None)))

    def loss(w, xb):
        return jnp.sum(jnp.tanh(xb @ w) ** 2)

    def accumulate(w, x):
        if deferred:
            w = jax.reshard(w, P(reduced={"data"}))

        def body(g, xb):
            return g + jax.grad(loss)(w, xb), None

        g0 = jnp.zeros_like(w)
        if deferred:
            g0 = jax.reshard(g0, P(unreduced={"data"}))
        g, _ = jax.lax.scan(body, g0, x)
        return jax.reshard(g, P()) if deferred else g

    with jax.set_mesh(mesh):
        program = hlo.compile(jax.jit(accumulate), w, x, compiler_options=hlo.FAST_COMPILE)
        grad = program(w, x)
    return {"counts": loop_counts(program), "grad_sum": float(jnp.sum(grad)),
            "grad_type": str(jax.typeof(grad))}


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a pytree of arrays (or of an NNX module's state), from each
    array's shard shape."""
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree)
    checks.array_tree("tree", tree)
    leaves = jax.tree.leaves(tree)
    for x in leaves:
        if not isinstance(x, jax.Array) and not (isinstance(x, jax.ShapeDtypeStruct)
                                                 and x.sharding is not None):
            raise checks.InputTypeError(
                f"tree must hold jax.Arrays (or ShapeDtypeStructs with a sharding), whose "
                f"shardings say what a device holds; got a leaf {checks.value_text(x)}.")
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
               for x in leaves)


def init_memory(config: Any, *, strategy: str, mesh: Any) -> hlo.MemoryStats:
    """Memory one device needs for :func:`logical.create`'s compiled initialisation: its
    outputs are the device's shards, its temporaries what it draws on the way."""
    config = logical.lm.check_config(config)
    rules = logical.rules_of(strategy)
    mesh = logical._check_mesh(mesh)
    check = logical.check_rules(rules, mesh)
    program, _ = logical._init_program(config, check, mesh, "float32", None)
    return hlo.memory_per_device(program)
