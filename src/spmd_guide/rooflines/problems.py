"""The Part's worked problems and exercises: each a question, its answer in words and the
number the answer rests on, every number computed from the chips file with
:mod:`spmd_guide.rooflines.formulas` (rooflines/rooflines, rooflines/parallelism). A test
checks each answer, so the folded answers on the pages cannot drift from the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spmd_guide.core import checks
from spmd_guide.rooflines import formulas, hardware


@dataclass(frozen=True)
class Problem:
    """A worked problem: the question, the answer in words, and the number it rests on."""

    key: str
    question: str
    answer: str
    value: float

    def __post_init__(self) -> None:
        for name in ("key", "question", "answer"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise checks.InputTypeError(
                    f"{name} must be a non-empty string, got {getattr(self, name)!r}.")
        object.__setattr__(self, "value", checks.real("value", self.value))


def _src(key: str) -> str:
    chip = hardware.CHIPS[key]
    return f"{chip.name}: {chip.source}"


def problems() -> list[Problem]:
    """The worked problems of the Part, every number computed from the chips file."""
    h100, v5e, v5p, h200 = (hardware.CHIPS[k] for k in ("h100-sxm", "tpu-v5e", "tpu-v5p", "h200"))
    out = []
    out.append(Problem(
        "ridge", "What arithmetic intensity must a bf16 program reach to be compute-bound on "
        "an H100 SXM?",
        f"peak / HBM bandwidth = {h100.peak_flops_bf16:.3g} / {h100.hbm_bandwidth:.3g} = "
        f"{h100.ridge:.0f} FLOPs per byte.", h100.ridge))
    b = formulas.critical_batch("tpu-v5e", d=8192, f=32768)
    out.append(Problem(
        "matmul_batch", "On a TPU v5e, from what batch B is the bf16 matmul "
        "x[B, 8192] @ W[8192, 32768] compute-bound?",
        f"Solve 2*B*8192*32768 / (2*(8192*B + 8192*32768 + 32768*B)) = {v5e.ridge:.0f} "
        f"(the v5e ridge): B = {b:.0f}, a little above the wide-weight limit "
        f"{formulas.critical_batch('tpu-v5e'):.0f}.", b))
    dp = formulas.dp_critical_batch("h100-sxm", n=8)
    out.append(Problem(
        "dp_nvlink", "Data parallelism over the 8 H100s of one node (bf16 gradients): from how "
        "many examples per GPU does the gradient all-reduce hide behind the backward pass?",
        f"Backward: 4*B*P FLOPs; all-reduce: 2*(7/8)*2*P bytes. Equal at B = 2*(7/8)*"
        f"{h100.peak_flops_bf16:.3g} / (2*{h100.interconnect_bandwidth:.3g}) = {dp:.0f}.", dp))
    dpn = formulas.dp_critical_batch("h100-sxm", link="network", group=8)
    flat = formulas.dp_critical_batch("h100-sxm", link="network", group=1)
    out.append(Problem(
        "dp_network", "The same all-reduce across many 8-GPU H100 nodes over InfiniBand "
        f"({h100.network_bandwidth / 1e9:g} GB/s per GPU): from how many examples per GPU?",
        "Each NIC carries 1/8 of the gradient. NCCL's rings are flat (they span NVLink and "
        "InfiniBand, one ring per NIC) and its trees move the same bytes, as a reduce inside "
        "the node first would: a reduce-scatter over NVLink, an all-reduce of each GPU's 1/8 "
        "over its own NIC, an all-gather over NVLink. So "
        f"B = 2 * {h100.peak_flops_bf16:.3g} / (2 * 8 * "
        f"{h100.network_bandwidth:.3g}) = {dpn:.0f} per GPU, {dpn / dp:.2f} times the NVLink "
        f"answer; the NVLink part still runs, so the step needs both: {max(dpn, dp):.0f} "
        "(the scaling book's GPU chapter gets 2475 from the same rates). A flat ring over the "
        f"NICs would charge each GPU the whole gradient, {flat:.0f}: 8 times too many.", dpn))
    need = math.ceil(7e9 * 16 / v5e.hbm_bytes)
    out.append(Problem(
        "fsdp_fit", "How many TPU v5e chips does FSDP need to hold a 7B-parameter model with "
        "AdamW state (float32 master weights, gradients and two moments: 16 bytes per "
        "parameter), before activations?",
        f"7e9 * 16 B = {7e9 * 16 / 1e9:g} GB over {v5e.hbm_bytes / 1e9:g} GB per chip: "
        f"{need} chips at least (in practice a power of two, and room for activations: 8 or "
        "16).", need))
    step = 6 * 7e9 * 1e6 / (256 * v5p.peak_flops_bf16)
    out.append(Problem(
        "train_step", "A 7B model trains on 1M-token batches on 256 TPU v5p chips. What is the "
        "compute-bound step time at peak FLOP/s?",
        f"6 * 7e9 * 1e6 FLOPs / (256 * {v5p.peak_flops_bf16:.3g} FLOP/s) = {step:.3f} s; "
        "a real step runs at a fraction of peak (its MFU).", step))
    ways = formulas.tp_max_ways("tpu-v5p", 28672)
    out.append(Problem(
        "tp_ways", "Over how many TPU v5p chips (one torus axis) can a bf16 weight with 28672 "
        "output columns be split before the all-gather of its input outlasts the matmul?",
        f"Compute-bound while 28672 >= (n-1) * {v5p.comm_ridge:.0f} (2 bytes x FLOP/s over link bandwidth / 2), "
        f"i.e. n <= {ways}.", ways))
    gather = formulas.ring_time(8192 * 28672 * 2, 8, "h100-sxm")
    out.append(Problem(
        "allgather", "How long does all-gathering a bf16[8192, 28672] weight over 8 H100s "
        "take at NVLink's published bandwidth?",
        f"(7/8) * {8192 * 28672 * 2 / 1e6:.0f} MB / {h100.interconnect_bandwidth / 1e9:g} GB/s "
        f"= {gather * 1e6:.0f} us (measured NCCL bandwidth is lower).", gather))
    rows = formulas.ring_matmul_balance_rows(4, "tpu-v5e")
    compute, comm = formulas.collective_matmul_times(4 * round(rows / 4), 8192, 8192, 4,
                                                     "tpu-v5e")
    best = formulas.overlap_speedup(compute, comm, ways=4)
    one_way = formulas.ring_matmul_balance_rows(4, "tpu-v5e", one_way=True)
    slow = formulas.overlap_speedup(*formulas.collective_matmul_times(
        4 * round(rows / 4), 8192, 8192, 4, "tpu-v5e", one_way=True), ways=4)
    out.append(Problem(
        "overlap", "The bidirectional all-gather collective matmul (allgather_bidi) on a "
        "ring of 4 TPU v5e chips (a 2x2 slice, whose 4 chips close a cycle; bf16): for how "
        "many rows m does overlapping pay the most, and how much?",
        "It does 4 block matmuls (2*m*k*n/16 FLOPs each) and 3 block transfers (k*n/4 "
        "elements each, half each way round, so both links of the axis carry them: the "
        "chips file's rate), each transfer beside the previous block's matmul; the last "
        "matmul has nothing left to hide. The gain is largest where one block's matmul takes "
        f"as long as one transfer: m = 4 * 2/2 * {v5e.comm_ridge:.0f} = {rows:.0f} rows. "
        "There the step takes the compute time alone instead of compute plus transfers: "
        f"speedup {best:.2f} = (2n-1)/n for n = 4, not 2; far from it, little gain. The "
        "one-way allgather_overlapped uses one link, so its balance lies at "
        f"{one_way:.0f} rows, and at m = {rows:.0f} it gains only "
        f"{slow:.2f}.", rows))
    decode = 7e9 * 2 / h200.hbm_bandwidth
    out.append(Problem(
        "decode", "Generating one token with a 7B bf16 model on one H200 reads every weight "
        "once. What is the memory-bound lower limit per token?",
        f"14 GB / {h200.hbm_bandwidth / 1e12:g} TB/s = {decode * 1e3:.2f} ms.", decode))
    return out


def intensity_exercises() -> list[Problem]:
    """The exercises closing the rooflines chapter (arithmetic intensity, critical batch)."""
    f32 = formulas.matmul_intensity(256, 4096, 4096, bytes_per_element=4)
    bf16 = formulas.matmul_intensity(256, 4096, 4096)
    b200 = hardware.CHIPS["b200"]
    return [
        Problem("f32_intensity", "What is the arithmetic intensity of x[256, 4096] @ "
                "W[4096, 4096] in float32, and in bfloat16?",
                f"2*256*4096*4096 / (b*(256*4096 + 4096*4096 + 256*4096)): {f32:.0f} FLOPs "
                f"per byte for b = 4, {bf16:.0f} for b = 2. Halving the bytes doubles it.",
                bf16),
        Problem("b200_batch", "From what batch is a bf16 matmul with a wide weight "
                "compute-bound on a B200, and why is that close to an H100's?",
                f"B* = ridge = {b200.peak_flops_bf16:.3g} / {b200.hbm_bandwidth:.3g} = "
                f"{b200.ridge:.0f} (H100 SXM: {hardware.CHIPS['h100-sxm'].ridge:.0f}): FLOP/s and "
                "HBM bandwidth grew by similar factors.", b200.ridge),
    ]
