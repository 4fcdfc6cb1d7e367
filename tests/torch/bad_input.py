#!/usr/bin/python3
"""Bad input through the Python binding and the torch device: each must be a clear
Python error (or a counted CPU fallback), and the session must carry on."""
import struct
import sys

import torch
import torch.nn.functional as F

import raccel
import raccel.torch

failures = []


def refused(what, words, call):
    try:
        call()
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        if words not in str(e):
            failures.append(f"{what}: error without '{words}': {e}")
        else:
            print(f"refused: {what}: {e}")
        return
    failures.append(f"{what}: not refused")


s = raccel.Session(tflops=1, program="bad-input")
small = s.alloc(64)   # 16 floats
big = s.alloc(4096)


def op_then_fence(*args, **kwargs):
    s.tensor(*args, **kwargs)
    s.fence()


refused("an operand past its buffer", "reaches element",
        lambda: op_then_fence("copy", [100], [(big, 0, [1]), (small, 0, [1])]))
refused("an unknown function", "no tensor function", lambda: s.tensor("explode", [4], [(big, 0, [1])]))
refused("too few operands", "takes 3 operands", lambda: op_then_fence("add", [4], [(big, 0, [1]), (small, 0, [1])]))
refused("strides that do not match the shape", "strides for a shape",
        lambda: op_then_fence("copy", [4, 4], [(big, 0, [4, 1]), (small, 0, [1])]))
refused("a buffer the session does not have", "does not exist in this session",
        lambda: op_then_fence("copy", [4], [(big, 0, [1]), (999999, 0, [1])]))
refused("seven dimensions", "dimensions",
        lambda: op_then_fence("copy", [1] * 7, [(big, 0, [0] * 7), (small, 0, [0] * 7)]))
refused("a huge stride", "reaches element",
        lambda: op_then_fence("copy", [2], [(big, 0, [1]), (small, 0, [1 << 62])]))
refused("a matmul writing over its input", "overlaps",
        lambda: op_then_fence("matmul", [2, 2, 2], [(big, 0, [2, 1, 0]), (big, 2, [2, 0, 1]), (big, 64, [0, 1, 2])]))
refused("a read past the end", "", lambda: s.read(small, 60, 8))
refused("a comparison written as f32", "writes bool",
        lambda: op_then_fence("eq", [4], [(big, 0, [1]), (small, 0, [1]), (small, 4, [1])]))
refused("an unknown element type", "no tensor element type",
        lambda: s.tensor("copy", [4], [(big, 0, [1]), (small, 0, [1])], types=["f32", "f8"]))
refused("an add of f64, a storage type", "copies, fills and picks alone",
        lambda: op_then_fence("add", [4], [(big, 0, [1]), (small, 0, [1]), (small, 0, [1])], types=["f64", "f64", "f64"]))
refused("a comparison of bf16 (f16 and bf16 go into float maps alone)", "copies, fills and picks alone",
        lambda: op_then_fence("lt", [4], [(big, 0, [1]), (small, 0, [1]), (small, 0, [1])], types=["bool", "bf16", "bf16"]))
refused("an index of f32", "the index is i64",
        lambda: op_then_fence("index_select", [1, 2, 1, 4], [(big, 0, [0, 1, 0, 0]), (small, 0, [0, 0, 0, 1]),
                                                             (small, 4, [0, 1, 0, 0])]))

# The session carries on: a fill and a read.
s.tensor("fill", [16], [(small, 0, [1])], alpha=1.5)
values = struct.unpack("16f", s.read(small, 0, 64))
if values != (1.5,) * 16:
    failures.append(f"the session did not carry on: {values}")

dev = raccel.torch.device()
raccel.torch.reset_fallbacks()
a = torch.arange(4).to(dev) + (1 << 40)   # int64 past f32's 2^24: exact on the card
total = (a + a).cpu().tolist()
if total != [(1 << 41) + 2 * i for i in range(4)] or raccel.torch.fallbacks():
    failures.append(f"int64 add gave {total}, fallbacks {raccel.torch.fallbacks()}")
d = torch.arange(4, dtype=torch.float64).to(dev)   # f64: kept on the card, but computed on the host
if (d + d).cpu().tolist() != [0.0, 2.0, 4.0, 6.0]:
    failures.append("f64 add gave a wrong result")
if "aten::add.out" not in raccel.torch.fallbacks():
    failures.append(f"the f64 add was not counted as a fallback: {raccel.torch.fallbacks()}")
# An index outside its dimension raises PyTorch's CPU error, by op, whether the index
# came from the host (its bounds counted as it was copied) or was made on the card (its
# bounds read back once, then known until it is written).
logits = torch.randn(3, 4).to(dev)
refused("a target outside the classes", "Target 9 is out of bounds",
        lambda: F.cross_entropy(logits, torch.tensor([0, 9, 1]).to(dev)).item())
refused("a negative target", "Target -5 is out of bounds",
        lambda: F.nll_loss(logits, torch.tensor([0, -5, 1]).to(dev), reduction="none").cpu())
ignored = F.cross_entropy(logits, torch.tensor([0, -100, 1]).to(dev)).item()
expected = F.cross_entropy(logits.cpu(), torch.tensor([0, -100, 1])).item()
if abs(ignored - expected) > 1e-5:
    failures.append(f"cross entropy with an ignored target gave {ignored}, the CPU {expected}")
refused("index_select past the rows", "index out of range in self",
        lambda: logits.index_select(0, torch.tensor([3]).to(dev)).cpu())
refused("an embedding of a token past the table", "index out of range in self",
        lambda: F.embedding(torch.tensor([[1, 4]]).to(dev), logits).cpu())
refused("an embedding bag of a token past the table", "index out of range in self",
        lambda: F.embedding_bag(torch.tensor([1, 4]).to(dev), logits, torch.tensor([0]).to(dev)).cpu())
refused("an embedding bag's offset past its indices", "offset 5 is past the 2 indices",
        lambda: F.embedding_bag(torch.tensor([1, 2]).to(dev), logits, torch.tensor([0, 5]).to(dev)).cpu())
refused("gather past the dimension", "index 4 is out of bounds for dimension 1 with size 4",
        lambda: logits.gather(1, torch.tensor([[4], [0], [1]]).to(dev)).cpu())
refused("scatter_add past the dimension", "index -1 is out of bounds for dimension 1 with size 4",
        lambda: logits.scatter_add(1, torch.tensor([[-1]]).to(dev), logits).cpu())
refused("index_add past the rows", "index out of range in self",
        lambda: logits.index_add(0, torch.tensor([3]).to(dev), logits[:1]).cpu())
refused("indexing past the end", "index 3 is out of bounds for dimension 0 with size 3",
        lambda: logits[torch.tensor([0, 3]).to(dev)].cpu())
refused("indexing before the start", "index -5 is out of bounds for dimension 1 with size 4",
        lambda: logits[:, torch.tensor([-5]).to(dev)].cpu())
refused("a put past the end", "index 7 is out of bounds for dimension 0 with size 3",
        lambda: logits.clone().index_put_((torch.tensor([7]).to(dev),), torch.tensor(1.0).to(dev)).cpu())
reads = raccel.torch.index_reads()
made = torch.tensor([1, 2]).to(dev) * 2          # made on the card: 2 and 4
refused("an index made on the card, past the rows", "index out of range in self",
        lambda: logits.index_select(0, made).cpu())
made -= 2                                        # written: 0 and 2, read again
for _ in range(3):                               # then known: read once
    if logits.index_select(0, made).cpu().tolist() != logits.cpu()[[0, 2]].tolist():
        failures.append("index_select by an index made on the card gave a wrong result")
if raccel.torch.index_reads() - reads != 2:
    failures.append(f"indices made on the card were read back {raccel.torch.index_reads() - reads} times, not twice")
reads = raccel.torch.index_reads()
_, top = logits.topk(2, dim=1)                   # positions the card made: known in range
picked = logits.gather(1, top).cpu()
host_index = torch.tensor([2, 0, 1]).to(dev)     # copied from the host: known as it passed
logits.index_select(0, host_index).cpu()
if raccel.torch.index_reads() != reads:
    failures.append(f"indices from the host or from topk were read back {raccel.torch.index_reads() - reads} times")
empty = torch.empty(0, 3).to(dev)          # no storage on the device: nothing is sent
if (empty + 1).cpu().shape != (0, 3) or (empty * empty).sum().item() != 0:
    failures.append("ops on an empty tensor did not give empty results")
x = torch.ones(5, 3).to(dev)
refused("a mismatched matmul", "mm of", lambda: torch.mm(x, x).cpu())
refused("scatter_add with an index larger than src", "is larger than src",
        lambda: x.scatter_add(0, torch.zeros(6, 3, dtype=torch.long).to(dev), x).cpu())
refused("masked_scatter_ with too few source elements", "the mask takes 15 elements, source has 4",
        lambda: x.clone().masked_scatter_(x > 0, torch.ones(4).to(dev)).cpu())
refused("indexing with f32 indices", "must be long, byte or bool", lambda: x[torch.tensor([1.5]).to(dev)].cpu())
refused("a mask of the wrong shape", "does not match the shape", lambda: x[torch.ones(3, dtype=torch.bool).to(dev)].cpu())
# Indexing an int16 tensor (its index tensors apart), and an op of PyTorch's that takes a
# list of optional tensors: both run on the host (counted), the indices moved there too.
host_x = torch.arange(60, dtype=torch.int16).reshape(5, 4, 3)
first, last = torch.tensor([0, 4]), torch.tensor([2, 1])
raccel.torch.reset_fallbacks()
apart = host_x.to(dev)[first.to(dev), :, last.to(dev)].cpu()
out = torch.empty(0, dtype=torch.int16).to(dev)
torch.ops.aten.index.Tensor_out(host_x.to(dev), [first.to(dev)], out=out)
if not torch.equal(apart, host_x[first, :, last]) or not torch.equal(out.cpu(), host_x[first]):
    failures.append("indexing that ran on the host gave a wrong result")
if set(raccel.torch.fallbacks()) != {"aten::index.Tensor", "aten::index.Tensor_out"}:
    failures.append(f"indexing on the host was not counted: {raccel.torch.fallbacks()}")
longs = torch.tensor([4, 9]).to(dev)
refused("an i64 tensor's sqrt_ in place", "can't be cast to the desired output type Long", lambda: longs.sqrt_())
refused("an i64 tensor's div_ in place", "can't be cast to the desired output type Long", lambda: longs.div_(2))
refused("an i64 floor division by 0", "ZeroDivisionError", lambda: (longs // 0).cpu())
refused("an i64 remainder by a tensor holding a 0", "ZeroDivisionError", lambda: (longs % (longs * 0)).cpu())
refused("an i64 tensor clamped in place by a fraction", "can't be cast to the desired output type Long",
        lambda: longs.clamp_(-2.5, 3))
refused("searchsorted with side='left' and right=True", "side and right can't be set to opposites",
        lambda: torch.searchsorted(x.flatten().sort().values, x, right=True, side="left").cpu())
refused("exp into an i64 out", "can't be cast", lambda: torch.exp(longs, out=torch.empty(2, dtype=torch.long).to(dev)))
refused("an op on the host that would write a list of tensors", "writes a list of tensors",
        lambda: torch._amp_foreach_non_finite_check_and_unscale_([x.clone()], torch.zeros(1).to(dev), torch.ones(1).to(dev)))
# Composed ops with PyTorch's own refusals (the host's check, where the card's would be another).
refused("glu over an odd dimension", "Halving dimension must be even", lambda: F.glu(x, 1).cpu())
refused("prelu with a weight for the wrong channels", "Mismatch of parameter numbers and input channel size",
        lambda: F.prelu(x, torch.ones(4).to(dev)).cpu())
refused("a flip naming a dimension twice", "appears multiple times", lambda: x.flip(0, 0).cpu())
refused("topk of more than the dimension holds", "selected index k out of range", lambda: x.topk(4, 1).values.cpu())
refused("kthvalue past the dimension", "k out of range", lambda: x.kthvalue(6, 1).values.cpu())
refused("kthvalue 0", "k out of range", lambda: x.kthvalue(0, 1).values.cpu())
refused("the median of an empty dimension", "median", lambda: x[:, :0].median(1).values.cpu())
refused("reflection padding as large as the input", "Padding size should be less than",
        lambda: F.pad(x.reshape(1, 3, 5), (5, 0), mode="reflect").cpu())
refused("bincount with a weight short of the values", "same length as input",
        lambda: torch.bincount(torch.tensor([1, 2]).to(dev), torch.ones(1).to(dev)).cpu())
refused("bincount of a negative value", "non-negative", lambda: torch.bincount(torch.tensor([1, -2]).to(dev)).cpu())
refused("take past the tensor's elements", "out of range: tried to access index 15 on a tensor of 15 elements",
        lambda: torch.take(x, torch.tensor([0, 15]).to(dev)).cpu())
refused("histc with min above max", "max must be larger than min", lambda: torch.histc(x, 4, 2, 1).cpu())
refused("multinomial of a negative weight", "probability tensor contains either `inf`, `nan` or element < 0",
        lambda: torch.multinomial(torch.tensor([0.5, -0.1]).to(dev), 1).cpu())
refused("multinomial of a NaN weight", "probability tensor contains",
        lambda: torch.multinomial(torch.tensor([[0.5, 0.5], [float("nan"), 1]]).to(dev), 2, True).cpu())
refused("multinomial of a row of zeros", "sum of probabilities <= 0",
        lambda: torch.multinomial(torch.tensor([[0.5, 0.5], [0.0, 0.0]]).to(dev), 1).cpu())
refused("multinomial of more samples than categories without replacement", "cannot sample n_sample > prob_dist.size(-1)",
        lambda: torch.multinomial(torch.ones(3).to(dev), 4).cpu())
refused("exponential_ with a negative rate", "lambda", lambda: torch.empty(3).to(dev).exponential_(-1.0).cpu())
refused("randperm of a negative count", "negative dimension", lambda: torch.randperm(-1, device=dev).cpu())
refused("normal with a negative deviation in a tensor", "normal expects all elements of std >= 0.0",
        lambda: torch.normal(torch.zeros(3).to(dev), torch.tensor([1.0, -1.0, 1.0]).to(dev)).cpu())
refused("randint of an empty range", "random_ expects 'from' to be less than 'to'",
        lambda: torch.randint(5, 5, (3,), device=dev).cpu())
refused("bernoulli of a probability past 1", "Expected p_in >= 0 && p_in <= 1", lambda: torch.bernoulli(torch.tensor([0.5, 1.5]).to(dev)).cpu())
refused("max_unpool2d with an index outside the plane", "Found an invalid max index: 99",
        lambda: F.max_unpool2d(torch.ones(1, 1, 2, 2).to(dev), torch.tensor([[[[0, 1], [2, 99]]]]).to(dev), 2).cpu())
refused("inv of a singular matrix", "The diagonal element 2 is zero",
        lambda: torch.linalg.inv(torch.tensor([[1.0, 2.0], [2.0, 4.0]]).to(dev)).cpu())
refused("cholesky of a matrix that is not positive-definite", "the leading minor of order 2 is not positive-definite",
        lambda: torch.linalg.cholesky(torch.tensor([[1.0, 2.0], [2.0, 1.0]]).to(dev)).cpu())
refused("cholesky of a batch, its second matrix not positive-definite", "(Batch element 1)",
        lambda: torch.linalg.cholesky(torch.stack([torch.eye(2), -torch.eye(2)]).to(dev)).cpu())
refused("solve with a singular matrix", "singular", lambda: torch.linalg.solve(torch.zeros(2, 2).to(dev), torch.ones(2).to(dev)).cpu())
refused("cholesky of a matrix that is not square", "must be batches of square matrices",
        lambda: torch.linalg.cholesky(torch.ones(2, 3).to(dev)).cpu())
refused("qr of a vector", "must have at least 2 dimensions", lambda: torch.linalg.qr(torch.ones(3).to(dev))[0].cpu())
refused("eigh of a matrix that is not square", "must be batches of square matrices",
        lambda: torch.linalg.eigh(torch.ones(2, 3).to(dev))[0].cpu())
refused("ctc_loss with an input length past the time steps", "Expected input_lengths to have value at most 4",
        lambda: F.ctc_loss(torch.zeros(4, 1, 3).to(dev), torch.tensor([[1]]).to(dev), (5,), (1,)).cpu())
refused("bicubic upsampling to a size of 0", "Input and output sizes should be greater than 0",
        lambda: F.interpolate(torch.ones(1, 1, 4, 4).to(dev), size=(0, 3), mode="bicubic").cpu())
refused("nearest 3-D upsampling to a size of 0", "Input and output sizes should be greater than 0",
        lambda: F.interpolate(torch.ones(1, 1, 2, 2, 2).to(dev), size=(2, 0, 3)).cpu())
refused("linear (1-D) upsampling of a 4-D input", "It is expected input_size equals to 3",
        lambda: torch._C._nn.upsample_linear1d(torch.ones(1, 1, 4, 4).to(dev), [3], False).cpu())
refused("3-D max pooling with a depth stride of 0 (it divided by it: the program died)", "stride should not be zero",
        lambda: torch.ops.aten.max_pool3d_with_indices(torch.ones(1, 1, 4, 4, 4).to(dev), [2, 2, 2], [0, 1, 1], [0, 0, 0],
                                                       [1, 1, 1], False)[0].cpu())
refused("3-D average pooling with a depth stride of 0", "stride should not be zero",
        lambda: torch.ops.aten.avg_pool3d(torch.ones(1, 1, 4, 4, 4).to(dev), [2, 2, 2], [0, 1, 1], [0, 0, 0], False, True,
                                          None).cpu())
refused("2-D average pooling with a kernel past 2^20 (the host's check, no arithmetic of ours on it)", "Output size is too small",
        lambda: torch.ops.aten.avg_pool2d(torch.ones(1, 1, 4, 4).to(dev), [2**21, 2], [1, 1], [0, 0], False, True, None).cpu())
refused("a transposed convolution whose groups do not divide its weight", "expected weight to be divisible by 3",
        lambda: F.conv_transpose2d(torch.ones(1, 4, 3, 3).to(dev), torch.ones(4, 2, 2, 2).to(dev), groups=3).cpu())
refused("multi_margin_loss with a target past the classes", "target out of range",
        lambda: F.multi_margin_loss(torch.ones(2, 3).to(dev), torch.tensor([0, 3]).to(dev)).cpu())
refused("multi_margin_loss with p = 3", "only p == 1 and p == 2 supported",
        lambda: F.multi_margin_loss(torch.ones(2, 3).to(dev), torch.tensor([0, 1]).to(dev), p=3).cpu())
refused("multilabel_margin_loss with a target past the classes", "'target' is out of range",
        lambda: F.multilabel_margin_loss(torch.ones(2, 3).to(dev), torch.tensor([[0, 3, -1], [1, -1, 0]]).to(dev)).cpu())
# An in-place op whose operands broadcast past self: PyTorch's error, and self unchanged.
narrow = torch.ones(4, 1).to(dev)
wide = torch.ones(4, 5).to(dev)
for name, inplace in [("add_", lambda: narrow.add_(wide)), ("mul_", lambda: narrow.mul_(wide)),
                      ("div_", lambda: narrow.div_(wide)), ("addcmul_", lambda: narrow.addcmul_(wide, wide)),
                      ("lerp_", lambda: narrow.lerp_(wide, 0.5)), ("xlogy_", lambda: narrow.xlogy_(wide)),
                      ("torch.maximum(out=self)", lambda: torch.maximum(narrow, wide, out=narrow))]:
    refused(f"{name} broadcasting past self", "doesn't match the broadcast shape [4, 5]", inplace)
if narrow.shape != (4, 1) or not torch.equal(narrow.cpu(), torch.ones(4, 1)):
    failures.append(f"an in-place op refused still changed self: {tuple(narrow.shape)}")
print("after the errors:", (x * 2).sum().item())
if (x * 2).sum().item() != 30:
    failures.append("the device did not carry on")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("all refused cleanly")
