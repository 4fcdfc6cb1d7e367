"""PyTorch's out-of-tree device over a raccel virtual accelerator.

    import torch, raccel.torch
    dev = raccel.torch.device(tflops=2)     # torch.device("privateuseone", 0)
    model = model.to(dev)                   # an unchanged training loop runs on raccel

The training step's ops (matmul, addmm, add, mul, div, sum, mean, relu, tanh, sigmoid,
gelu, silu, leaky relu, softplus, hardtanh, hardswish, hardsigmoid, mish, elu, glu,
prelu, layer norm, softmax, log-softmax, NLL and MSE losses, with their backward ops; the
steps of SGD, Adam and AdamW: addcmul, addcdiv, sqrt, maximum, lerp; clamp, exp, log,
norms, var, std, cat, cumsum, flip, sort, topk) and, on bool and i64 tensors, comparisons, where,
masked_fill, argmax/argmin, max/min, integer sums and dtype conversions; bmm, embeddings,
dropout and the random fills; convolutions, batch norm, pooling and reflection padding,
composed of these) are raccel tensor ops, sent without waiting; only
.item(), .cpu() and printing wait. Every other op runs on the CPU through PyTorch's
fallback, counted: fallbacks() says which and how often, and RACCEL_TORCH_FALLBACKS=1
prints them when the program exits.

raccel.torch.assess(model, example_input, steps_per_second) counts the FLOPs of one
training step and the TFLOPS and blocks it needs; device(model=..., example_input=...,
steps_per_second=...) asks for that many.

Import raccel.torch before the program's first backward(): PyTorch's autograd engine
sizes its device threads once, on the first backward, from the devices registered then.
"""
import atexit
import os
import types as _types
import warnings as _warnings

import torch as _torch

from . import _raccel
from . import _torch as _device
from .assess import Assessment, assess  # noqa: F401 (raccel.torch.assess)

_session = None


def device(tflops=1.0, kinds=(), socket="", priority=0, session=None, admit_wait_ms=0, model=None, example_input=None,
           steps_per_second=None, optimizer=None, block_tflops=1.0):
    """Opens (once) the session the device's tensors live in; returns the torch device.

    With `model`, `example_input` and `steps_per_second`, the TFLOPS asked for are
    assessed from the model (assess(), printed) instead of `tflops`. A need larger than
    the whole pool is refused at once, naming both figures; one larger than the free
    blocks waits (`admit_wait_ms`) or preempts by `priority`, as admission does.
    """
    global _session
    if _session is None:
        estimate = None
        if model is not None:
            if example_input is None or steps_per_second is None:
                raise ValueError("device(model=...) needs example_input and steps_per_second too")
            estimate = assess(model, example_input, steps_per_second, optimizer=optimizer, block_tflops=block_tflops)
            print(f"raccel.torch: the model needs {estimate}", flush=True)
            tflops = estimate.tflops
        try:
            _session = session if session is not None else _raccel.Session(
                tflops=tflops, kinds=list(kinds), socket=socket, program="torch", priority=priority,
                admit_wait_ms=admit_wait_ms)
        except RuntimeError as e:
            if estimate is not None:
                raise RuntimeError(f"raccel.torch: the model needs {estimate.tflops:.4g} TFLOPS ({estimate.blocks} blocks "
                                   f"of {estimate.block_tflops:g}), and the pool refused it: {e}") from None
            raise
        _device.attach(_session._capsule())
    return _torch.device("privateuseone", 0)


def session():
    """The raccel.Session behind the device (None before device())."""
    return _session


def synchronize():
    """Waits until every op sent so far has run; raises the first failure."""
    if _session is not None:
        _session.fence()


def fallbacks():
    """{op: calls} of the ops that ran on the CPU instead of raccel."""
    return dict(_device.fallbacks())


def reset_fallbacks():
    _device.reset_fallbacks()


def index_reads():
    """How many times an op's index was read back from the card to check it lies inside
    its dimension (each one wait). Indices copied from the host, and positions the card
    made (argmax's, sort's), are checked without it."""
    return _device.index_reads()


def _location_tag(storage):
    """torch.save's name for where a storage lives: the device's storages are saved as
    'privateuseone' (their bytes copied to the host)."""
    return "privateuseone" if storage.device.type == "privateuseone" else None


_warned_load = False


def _restore(storage, location):
    """torch.load of a storage saved from the device (or with map_location=the device):
    torch 1.13 rebuilds tensors from storages of its own devices only, so these load on
    the CPU, once with a warning; load_state_dict() copies them into a model on the
    device, and .to(device) moves any other."""
    global _warned_load
    if not location.startswith("privateuseone"):
        return None
    if not _warned_load:
        _warned_load = True
        _warnings.warn("raccel.torch: tensors saved from (or mapped to) the raccel device load on the CPU under torch "
                       "1.13; load_state_dict() copies them into a model on the device, .to(device) moves others")
    return storage


_torch.serialization.register_package(15, _location_tag, _restore)


def _register_device_module():
    """PyTorch 2.x imports torch.privateuseone before it first moves a tensor to the
    device, and asks it whether the process forked and how to seed the device. The
    device draws its random numbers from keys taken from PyTorch's CPU generator, which
    torch.manual_seed seeds already: the device has no seed of its own to set."""
    if not hasattr(_torch._C, "_get_privateuse1_backend_name") or hasattr(_torch, "privateuseone"):
        return  # torch 1.13 asks for no such module
    module = _types.ModuleType("torch.privateuseone")
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module._is_in_bad_fork = lambda: False
    module.manual_seed_all = lambda seed: None
    _torch._register_device_module("privateuseone", module)


_register_device_module()

# torch.save copies each storage to the host with UntypedStorage.cpu(), which torch 1.13
# implements for its own devices only: the device's storages are read through raccel.
_host_storage = _torch.UntypedStorage.cpu


def _storage_cpu(self):
    if self.device.type != "privateuseone":
        return _host_storage(self)
    return _torch.UntypedStorage.from_buffer(_device.read_storage(self.data_ptr(), self.nbytes()), dtype=_torch.uint8)


_torch.UntypedStorage.cpu = _storage_cpu

# torch 1.13's legacy Tensor.new() refuses a privateuseone tensor ("new(): expected key in
# DispatchKeySet(CPU, CUDA, ...)"), and PyTorch's own code calls it: nn.init.orthogonal_,
# optim.Rprop. On the device it is what it is elsewhere: new(*sizes) an uninitialized
# tensor of its dtype, new() an empty one, new(data) a tensor of that data.
_legacy_new = _torch.Tensor.new


def _tensor_new(self, *args, **kwargs):
    if self.device.type != "privateuseone" or kwargs:
        return _legacy_new(self, *args, **kwargs)
    if not args:
        return self.new_empty((0,))
    if len(args) == 1 and isinstance(args[0], _torch.Size):
        return self.new_empty(tuple(args[0]))
    if all(isinstance(a, int) for a in args):
        return self.new_empty(args)
    if len(args) == 1 and not isinstance(args[0], _torch.Tensor):
        return self.new_tensor(args[0])
    return _legacy_new(self, *args, **kwargs)


_torch.Tensor.new = _tensor_new

if os.environ.get("RACCEL_TORCH_FALLBACKS", "") not in ("", "0"):
    atexit.register(_device.print_fallbacks)
