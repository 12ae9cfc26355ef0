"""spmd_guide.nn: the face of Part IV re-exports the model and the strategies, one way."""

import subprocess
import sys

from spmd_guide import mlp, nn, strategies


def test_names_are_the_defining_modules_own():
    assert nn.STRATEGIES is strategies.STRATEGIES and nn.Strategy is strategies.Strategy
    assert nn.init_mlp is mlp.init_mlp and nn.mlp_loss is mlp.mlp_loss
    assert {"dp", "fsdp", "tp", "auto_dp", "auto_dp_tp"} <= set(nn.STRATEGIES)
    assert set(nn.__all__) <= set(dir(nn))


def test_no_module_of_the_package_imports_in_a_circle():
    """Every module imports on its own in a fresh interpreter, in any order (a cycle fails
    for one of its members), and no module defines a lazy module __getattr__."""
    import pkgutil

    import spmd_guide

    names = [m.name for m in pkgutil.iter_modules(spmd_guide.__path__)]
    code = "; ".join(f"import spmd_guide.{n}" for n in reversed(sorted(names)))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    for name in names:
        module = __import__(f"spmd_guide.{name}", fromlist=["_"])
        assert "__getattr__" not in vars(module), name
