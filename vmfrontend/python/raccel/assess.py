"""The compute one step of a model needs, counted from the ops the step runs.

assess(model, example_input, steps_per_second) runs one step of a copy of the model on
PyTorch's CPU (forward, and for training the backward of the output's sum) and counts,
op by op: 2*m*k*n for each matmul (mm, addmm, bmm, baddbmm), 2*outputs*(inputs per
output) for each convolution and each half of its backward, and one per output element
for every other op that computes (views, copies and allocations count nothing). With
an optimizer named, its step adds a fixed count per parameter (OPTIMIZER_FLOPS). The
FLOPs per step times the steps per second is the TFLOPS the model needs; at the pool's
block size (1 TFLOPS unless given) that is a number of blocks.
"""
import copy
import math
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
# Per parameter element, one optimizer step: SGD's update; with momentum, the buffer's
# too; Adam's and AdamW's two moments, bias corrections, square root and division.
OPTIMIZER_FLOPS = {"sgd": 2, "sgd-momentum": 4, "adam": 12, "adamw": 14}
_MATMULS = {_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm}
# Views, copies, allocations and reads: no arithmetic.
_FREE = {getattr(_aten, name) for name in (
    "view", "_unsafe_view", "_reshape_alias", "as_strided", "t", "transpose", "permute", "expand", "detach", "slice",
    "select", "unsqueeze", "squeeze", "alias", "split", "split_with_sizes", "unbind", "chunk", "narrow", "empty",
    "empty_like", "empty_strided", "zeros", "zeros_like", "ones_like", "new_zeros", "new_empty", "new_empty_strided",
    "clone", "copy_", "_to_copy", "lift_fresh", "fill_", "zero_", "full", "scalar_tensor", "_local_scalar_dense")
    if hasattr(_aten, name)}


class Assessment(NamedTuple):
    flops_per_step: float      # all of it
    matmul_flops: float        # matmuls and convolutions
    elementwise_flops: float   # every other op, one per output element
    optimizer_flops: float
    steps_per_second: float
    tflops: float              # flops_per_step * steps_per_second / 1e12
    block_tflops: float
    blocks: int                # ceil(tflops / block_tflops), at least 1

    def __str__(self):
        return (f"{self.flops_per_step / 1e9:.4g} GFLOP per step (matmul and convolution {self.matmul_flops / 1e9:.4g}, "
                f"elementwise {self.elementwise_flops / 1e9:.4g}, optimizer {self.optimizer_flops / 1e9:.4g}) x "
                f"{self.steps_per_second:g} steps/s = {self.tflops:.4g} TFLOPS: {self.blocks} block"
                f"{'s' if self.blocks != 1 else ''} of {self.block_tflops:g} TFLOPS")


def _elements(x):
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (list, tuple)):
        return sum(_elements(t) for t in x)
    return 0


def _conv_flops(output_elements, weight):
    per_output = weight.shape[1] * math.prod(weight.shape[2:])  # inputs per output: C/groups * kernel
    return 2.0 * output_elements * per_output


class _Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.matmul = 0.0
        self.elementwise = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        if packet in _MATMULS:
            a, b = (args[0], args[1]) if packet in (_aten.mm, _aten.bmm) else (args[1], args[2])
            self.matmul += 2.0 * a.numel() * b.shape[-1]
        elif packet is _aten.convolution:
            self.matmul += _conv_flops(out.numel(), args[1])
        elif packet is _aten.convolution_backward:
            grad, weight, mask = args[0], args[2], args[-1]
            self.matmul += _conv_flops(grad.numel(), weight) * (int(mask[0]) + int(mask[1]))
            self.elementwise += grad.numel() if mask[2] else 0
        elif packet not in _FREE:
            self.elementwise += _elements(out)
        return out


def assess(model, example_input, steps_per_second=1.0, training=True, optimizer=None, block_tflops=1.0):
    """The Assessment of one step of `model` on `example_input` (a tensor or a tuple of
    them), at `steps_per_second`: training (forward and backward) or inference."""
    if not (steps_per_second > 0 and math.isfinite(steps_per_second)):
        raise ValueError(f"steps_per_second must be a positive number, not {steps_per_second!r}")
    if not block_tflops > 0:
        raise ValueError(f"block_tflops must be positive, not {block_tflops!r}")
    if optimizer is not None and optimizer not in OPTIMIZER_FLOPS:
        raise ValueError(f"optimizer {optimizer!r}: one of {', '.join(OPTIMIZER_FLOPS)} or None")
    net = copy.deepcopy(model).to("cpu")
    inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    inputs = tuple(t.to("cpu") if isinstance(t, torch.Tensor) else t for t in inputs)
    counter = _Counter()
    with counter:
        if training:
            out = net(*inputs)
            out = out[0] if isinstance(out, (tuple, list)) else out
            out.float().sum().backward()
        else:
            with torch.no_grad():
                net(*inputs)
    parameters = sum(p.numel() for p in net.parameters() if p.requires_grad)
    step_optimizer = OPTIMIZER_FLOPS[optimizer] * parameters if (optimizer and training) else 0.0
    total = counter.matmul + counter.elementwise + step_optimizer
    tflops = total * steps_per_second / 1e12
    return Assessment(total, counter.matmul, counter.elementwise, float(step_optimizer), float(steps_per_second), tflops,
                      float(block_tflops), max(1, math.ceil(tflops / block_tflops - 1e-9)))
