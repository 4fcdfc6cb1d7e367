#!/usr/bin/python3
"""Each op raccel.torch runs on the card, forward and backward, beside PyTorch's CPU.

For every case: the same inputs on the CPU and on the raccel device, the op applied, a
fixed upstream gradient sent back through it; the outputs and the inputs' gradients must
agree to --rtol (relative, with an absolute floor of --atol), and no op of the case may
fall back to the CPU. Prints one line per case and PASS or FAIL; exits 1 on any failure.
"""
import argparse
import sys
import zlib

import torch
import torch.nn.functional as F

import raccel.torch

ACTIVATIONS = [
    ("relu", F.relu), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("gelu", F.gelu),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")), ("silu", F.silu),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2)), ("softplus", lambda x: F.softplus(x, beta=2, threshold=3)),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.75)),
    # (inputs to +-6, past the ramps' corners at +-3)
    ("hardswish", lambda x: F.hardswish(3 * x)), ("hardsigmoid", lambda x: F.hardsigmoid(3 * x)), ("mish", F.mish),
]

NAN = float("nan")


def put(x, index, values):
    """A copy of x with x[index] = values (index_put_ without accumulate)."""
    y = x * 1
    y[index] = values
    return y


CASES = [(name, [(4, 6)], lambda x, f=f: f(x)) for name, f in ACTIVATIONS] + [
    ("softmax dim -1", [(5, 7)], lambda x: torch.softmax(x, -1)),
    ("softmax dim 0", [(5, 7)], lambda x: torch.softmax(x, 0)),
    ("log_softmax dim 1 of 3", [(2, 3, 4)], lambda x: torch.log_softmax(x, 1)),
    ("layer_norm with weight and bias", [(3, 4, 8), (8,), (8,)], lambda x, w, b: F.layer_norm(x, (8,), w, b)),
    ("layer_norm over two dims, no affine", [(3, 4, 8)], lambda x: F.layer_norm(x, (4, 8))),
    ("mean over dim 1, keepdim", [(3, 5, 2)], lambda x: x.mean(1, keepdim=True)),
    ("mean of all", [(4, 4)], lambda x: x.mean()),
    ("div broadcast", [(4, 5), (5,)], lambda a, b: a / (b.abs() + 0.5)),
    ("div by a number", [(4, 5)], lambda a: a / 3),
    ("pow by a number", [(4, 5)], lambda a: a.pow(3)),
    ("sqrt", [(4, 5)], lambda a: (a.abs() + 0.1).sqrt()),
    ("sub, sign", [(4, 5), (5,)], lambda a, b: (a - b) * torch.sign(b) - a.sub(b, alpha=2)),
    ("addcmul, addcdiv", [(4, 5), (4, 5), (5,)],
     lambda a, b, c: torch.addcmul(a, b, c, value=0.5) + torch.addcdiv(a, b, c.abs() + 0.5, value=-2)),
    ("mse loss", [(6, 3), (6, 3)], lambda a, b: F.mse_loss(a, b)),
    # maximum's and minimum's backwards compare and select (eq, lt, where, masked_fill).
    ("maximum, minimum", [(4, 5), (4, 5)], lambda a, b: torch.maximum(a, b) * 2 - torch.minimum(a, b)),
    ("linear with bias", [(5, 4), (3, 4), (3,)], lambda x, w, b: F.linear(x, w, b)),
    ("clamp, clamp_min, clamp_max", [(4, 5)], lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1) * x.clamp(max=0.2)),
    ("exp, log, log1p, reciprocal, rsqrt", [(4, 5)],
     lambda a: a.exp() + (a.abs() + 0.5).log() + a.abs().log1p() + (a.abs() + 0.5).reciprocal() + (a.abs() + 0.5).rsqrt()),
    ("glu over dim 1 and dim 0", [(4, 6)], lambda x: F.glu(x, 1).sum(1)[:2] + F.glu(x, 0).sum(0)[:2]),
    ("prelu, one weight a channel", [(3, 4, 5), (4,)], lambda x, w: F.prelu(x, w)),
    ("prelu, one weight for all", [(6, 5), (1,)], lambda x, w: F.prelu(x, w)),
    ("sort along each dim, both ways (values; the indices below)", [(5, 7)],
     lambda x: torch.cat([x.sort(1).values.flatten(), x.sort(0, descending=True).values.flatten(), x.msort().flatten()])),
    ("topk largest and smallest, and the indices of sort and topk", [(6, 9)],
     lambda x: torch.cat([x.topk(3, 1).values.flatten(), x.topk(2, 0, largest=False).values.flatten()])
     + 0 * (x.argsort(1).float().sum() + x.topk(4, 1).indices.float().sum() + x.sort(stable=True).indices.float().sum())),
    ("cumsum over dim 1 and 0, flip", [(5, 13)], lambda x: x.cumsum(1) + x.flip(0).cumsum(0) * x.flip(1, 0)),
    ("cumsum of a mask (positions), as i64", [(4, 9)], lambda x: (x > 0).cumsum(1) * x),
    ("cumprod over dim 1 and of a transpose, with its backward", [(4, 11)],
     lambda x: x.cumprod(1) + (x * 0.5 + 1).t().cumprod(0).t()),
    ("cumprod of i64 (exact)", [(3, 9)], lambda x: (x * 2).long().cumprod(1)),
    ("x[idx] = values with a row named thrice (the last wins), with backwards", [(6, 5), (4, 5)],
     lambda x, v: put(x, torch.tensor([4, 1, 4, 4], device=x.device), v)),
    ("x[:, idx] = values, x[rows, cols] = values, x[mask] = values", [(6, 5), (6, 3)],
     lambda x, v: put(put(x, (slice(None), torch.tensor([0, 2, 0], device=x.device)), v),
                      (torch.tensor([0, 5], device=x.device), torch.tensor([1, 1], device=x.device)), v[0, :2])
     + put(x, x > 0.5, (x * 10)[x > 0.5])),
    ("kthvalue and median over dims and of all, with their backwards", [(5, 7)],
     lambda x: x.kthvalue(3, 1).values * 2 + x.t().median(0).values + x.median(0, keepdim=True).values.sum() + x.median()),
    ("kthvalue's and median's positions; a row with a NaN has a NaN median at its first NaN", [(6, 5)],
     lambda x: torch.cat([x.kthvalue(2, 0).indices, x.median(1).indices, x.log().median(1).indices,
                          x.log().median(1).values.isnan().long(), x.log().median().isnan().long().reshape(1)])),
    ("reflection padding, 2d and 1d", [(2, 3, 4, 5), (2, 3, 6)],
     lambda x, y: torch.cat([F.pad(x, (1, 2, 3, 1), mode="reflect").flatten(), F.pad(y, (2, 1), mode="reflect").flatten()])),
    ("elu", [(4, 6)], lambda x: F.elu(x, 0.8)),
    ("selu (elu scaled after)", [(4, 6)], lambda x: F.selu(x)),
    ("celu (elu with an input scale), alpha 0.5 and 2", [(4, 6)], lambda x: F.celu(x, 0.5) + F.celu(x * 3, 2.0)),
    ("elu and selu in place (their backwards from the result)", [(4, 6)],
     lambda x: F.elu(x * 2, 0.7, inplace=True) + F.selu(x - 0.3, inplace=True)),
    ("lerp", [(4, 5), (4, 5)], lambda a, b: torch.lerp(a, b, 0.3)),
    ("where, masked_fill", [(4, 5), (4, 5)], lambda a, b: torch.where(a > 0, a, b * 2) + a.masked_fill(b < 0, 0.5)),
    ("comparisons with tensors and numbers (bool results)", [(4, 5), (4, 5)],
     lambda a, b: ((a > b).float() + (a >= 0).float() * 2 + (a < b).float() * 4 + (a <= 0.5).float() * 8
                   + (a == a).float() * 16 + (a != b).float() * 32 + (a > 0).logical_not().float() * 64
                   + torch.isnan(a.log()).float() * 128)),
    ("argmax over dim 1", [(6, 5)], lambda x: x.argmax(1)),
    ("argmin of all, keepdim", [(3, 4, 2)], lambda x: x.argmin()),
    ("argmax over dim 0, keepdim", [(6, 5)], lambda x: x.argmax(0, keepdim=True)),
    ("accuracy: argmax == an i64 target, as a mean", [(8, 4)],
     lambda x: (x.argmax(1) == (x[:, 0] > 0).long()).float().mean()),
    ("correct count: an i64 sum of bools", [(8, 4)], lambda x: (x > 0).sum() + (x > 0).long().sum(1).sum()),
    ("amax, amin over dims", [(3, 4, 5)], lambda x: x.amax(1) - x.amin((0, 2), keepdim=True).sum()),
    ("one_hot without num_classes (an i64 max), i64 max, min, argmax and abs, bool amax and amin", [(8, 4)],
     lambda x: (lambda labels, m: torch.cat([
         F.one_hot(labels).sum(0), labels.max().reshape(1), labels.min().reshape(1), labels.argmax().reshape(1),
         (labels - 3).abs(), labels.reshape(2, 4).max(1).values, labels.reshape(2, 4).min(1).indices,
         m.amax(1).long(), m.amin(0).long()]))((x[:, 0] * 3).long().abs(), x > 0)),
    ("max and min over a dim, and of all (forward)", [(4, 6)],
     lambda x: (x.max(1).values - x.min(0, keepdim=True).values.sum() + x.max() - x.min()).detach()),
    ("max.dim's positions", [(4, 6)], lambda x: x.max(1).indices + x.min(0).indices.sum()),
    ("max and min over a dim with their backwards (a scatter of one pick a row)", [(4, 6)],
     lambda x: x.max(1).values * 2 + x.min(0, keepdim=True).values.sum() + x.reshape(2, 2, 6).amax(1).sum()),
    ("scatter of a number (repeated picks) and of src (one pick a row), with backwards", [(4, 5), (4, 1)],
     lambda x, s: x.scatter(1, torch.tensor([[0, 2, 2], [1, 1, 4], [3, 0, 0], [4, 4, 4]], device=x.device), 7.0)
     + x.scatter(1, torch.tensor([[3], [0], [4], [3]], device=x.device), s * 10)),
    ("var and std, unbiased and not", [(4, 6)],
     lambda x: x.var(1) + x.std(0, keepdim=True).sum() + x.var(unbiased=False) + x.std()),
    ("logical and, or, not of masks", [(4, 5), (4, 5)],
     lambda a, b: ((a > 0) & (b > 0)).float() + ((a > 0) | (b < 0)).float() * 2 + (~(a > b)).float() * 4),
    ("bmm and baddbmm over transposed views", [(3, 4, 5), (3, 6, 5), (3, 4, 6)],
     lambda a, b, c: torch.bmm(a, b.transpose(1, 2)) + torch.baddbmm(c, a, b.transpose(1, 2), beta=0.5, alpha=2)),
    ("embedding (index_select) and its dense backward, with a padding row", [(7, 3)],
     lambda w: F.embedding(torch.tensor([[1, 3, 3], [0, 6, 2]], device=w.device), w, padding_idx=3)),
    ("index_select over dim 1, and its backward (index_add)", [(4, 6)],
     lambda x: x.index_select(1, torch.tensor([5, 0, 0, 2], device=x.device))),
    ("all, any", [(4, 5)], lambda x: ((x > -3).all().float() + (x > 1).any(1).float().sum() + (x > 0).all(0).float().sum())),
    ("conv2d with bias, padding 1", [(2, 3, 6, 6), (4, 3, 3, 3), (4,)], lambda x, w, b: F.conv2d(x, w, b, padding=1)),
    ("conv2d stride 2, dilation 2, no bias", [(2, 2, 9, 9), (3, 2, 3, 3)], lambda x, w: F.conv2d(x, w, stride=2, dilation=2)),
    ("conv_transpose2d stride 2, padding 1, output padding 1, with bias", [(2, 3, 4, 5), (3, 4, 3, 3), (4,)],
     lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)),
    ("conv_transpose2d kernel 2x3, stride (1, 2), dilation 2, no bias", [(1, 2, 3, 4), (2, 3, 2, 3)],
     lambda x, w: F.conv_transpose2d(x, w, stride=(1, 2), dilation=2)),
    ("conv_transpose2d grouped (2 groups of 2 in, 3 out), stride 2, output padding 1, with bias; depthwise",
     [(2, 4, 4, 5), (4, 3, 3, 3), (6,), (4, 1, 2, 2)],
     lambda x, w, b, d: torch.cat([F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2).flatten(),
                                   F.conv_transpose2d(x, d, stride=2, groups=4).flatten()])),
    ("batch_norm training with running stats", [(4, 3, 5, 5), (3,), (3,)],
     lambda x, w, b: F.batch_norm(x, torch.zeros(3, device=x.device), torch.ones(3, device=x.device), w, b, training=True)),
    ("batch_norm's running mean and unbiased variance after a training step", [(4, 3, 5, 5)],
     lambda x: (lambda rm, rv: torch.cat([F.batch_norm(x * 3 + 1, rm, rv, training=True, momentum=0.3).flatten(), rm, rv]))(
         torch.full((3,), 0.5, device=x.device), torch.full((3,), 2.0, device=x.device))),
    ("batch_norm eval", [(4, 3, 5, 5), (3,), (3,)],
     lambda x, w, b: F.batch_norm(x, torch.full((3,), 0.5, device=x.device), torch.full((3,), 2.0, device=x.device), w, b)),
    ("max_pool2d 2x2, and 3x3 stride 2 padding 1", [(2, 3, 8, 8)],
     lambda x: F.max_pool2d(x, 2).sum() + F.max_pool2d(x, 3, stride=2, padding=1)),
    ("max_pool2d's indices", [(2, 2, 6, 6)], lambda x: F.max_pool2d(x, 2, return_indices=True)[1]),
    ("avg_pool2d, adaptive_avg_pool2d", [(2, 3, 8, 8)],
     lambda x: F.avg_pool2d(x, 2) + F.adaptive_avg_pool2d(x, 4) * 2 + F.adaptive_avg_pool2d(x, 1)),
    ("bilinear upsampling: a size, a scale, align_corners, and down", [(2, 3, 4, 5)],
     lambda x: torch.cat([F.interpolate(x, size=(7, 9), mode="bilinear").flatten(),
                          F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True).flatten(),
                          F.interpolate(x, size=(3, 2), mode="bilinear").flatten()])),
    ("bicubic upsampling: a size, a scale, align_corners, down, and a size of one", [(2, 3, 4, 5)],
     lambda x: torch.cat([F.interpolate(x, size=(7, 9), mode="bicubic").flatten(),
                          F.interpolate(x, scale_factor=1.5, mode="bicubic", align_corners=True).flatten(),
                          F.interpolate(x, size=(3, 2), mode="bicubic").flatten(),
                          F.interpolate(x, size=(1, 6), mode="bicubic", align_corners=True).flatten()])),
    ("ceil_mode pooling: max (plain and padded) and average (with padding, with and without it counted)", [(2, 3, 7, 8)],
     lambda x: torch.cat([F.max_pool2d(x, 2, ceil_mode=True).flatten(), F.max_pool2d(x, 3, 2, 1, ceil_mode=True).flatten(),
                          F.avg_pool2d(x, 3, 2, 1, ceil_mode=True).flatten(),
                          F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False).flatten()])),
    ("adaptive_avg_pool2d to sizes that do not divide the input (overlapping windows, and larger)", [(2, 3, 7, 10)],
     lambda x: torch.cat([F.adaptive_avg_pool2d(x, (3, 4)).flatten(), F.adaptive_avg_pool2d(x, (9, 13)).flatten()])),
    ("conv2d kernel 3x2, stride (2, 1), padding (1, 0)", [(2, 3, 7, 5), (4, 3, 3, 2)],
     lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 0))),
    ("max_pool2d 3x3 stride 2 dilation 2, overlapping windows", [(2, 2, 9, 9)],
     lambda x: F.max_pool2d(x, 3, stride=2, dilation=2)),
    ("avg_pool2d 3x3 stride 2 padding 1, overlapping, padding counted", [(2, 3, 7, 7)],
     lambda x: F.avg_pool2d(x, 3, stride=2, padding=1)),
    ("avg_pool2d 2x2 stride 3, positions no window reads", [(2, 3, 8, 8)], lambda x: F.avg_pool2d(x, 2, stride=3)),
    ("l1, smooth_l1, huber losses", [(6, 4), (6, 4)],
     lambda a, b: F.l1_loss(a, b) + F.smooth_l1_loss(a, b, beta=0.5) + F.huber_loss(a, b, delta=0.7)),
    ("binary cross-entropy, with logits", [(6, 4), (6, 4)],
     lambda a, b: F.binary_cross_entropy(torch.sigmoid(a), torch.sigmoid(b).detach())
     + F.binary_cross_entropy_with_logits(a, torch.sigmoid(b).detach())),
    ("gather along dims 1 and 0, and its backward (scatter_add)", [(4, 5)],
     lambda x: (x.gather(1, torch.tensor([[0, 4], [1, 1], [3, 2], [0, 0]], device=x.device)).sum(1)
                + x.gather(0, torch.tensor([[3, 2, 1, 0, 0]], device=x.device)).sum())),
    ("scatter_add along dims 0 and 2", [(3, 4, 5), (2, 4, 5), (3, 4, 2)],
     lambda x, s, t: (x.scatter_add(0, torch.tensor([[[0, 2, 2, 1, 0]] * 4, [[1, 1, 0, 2, 2]] * 4], device=x.device), s)
                      + x.scatter_add(2, torch.tensor([[[4, 4]] * 4] * 3, device=x.device), t))),
    ("scatter_add_ with an index smaller than src (forward)", [(3, 5), (4, 6)],
     lambda x, s: x.detach().clone().scatter_add_(1, torch.tensor([[0, 4, 4], [2, 2, 1]], device=x.device), s.detach())),
    ("index_add along dim 1 with alpha", [(3, 5), (3, 4)],
     lambda x, s: x.index_add(1, torch.tensor([4, 0, 4, 2], device=x.device), s, alpha=-1.5)),
    # Advanced indexing: one index_select over the indexed dimensions merged, and its
    # backward one index_add (repeated picks add up).
    ("x[i64], x[:, i64 2-D], with negative and repeated picks", [(5, 4, 3)],
     lambda x: x[torch.tensor([1, -1, 0, 1], device=x.device)].sum((0, 1))
     + x[:, torch.tensor([[3, 0], [-2, 3]], device=x.device)].sum((0, 1, 2))),
    ("x[a, b] (an element per row), x[mask], x[:, mask]", [(5, 4), (5, 4)],
     lambda x, m: torch.cat([x[torch.arange(5, device=x.device), torch.tensor([0, 3, 2, 3, 1], device=x.device)],
                             x[m > 0] * 2, x[:, torch.tensor([True, False, True, True], device=x.device)].reshape(-1)])),
    ("repeat and unfold (views of a view)", [(2, 5)], lambda x: x.repeat(2, 3) * x.unfold(1, 3, 2).sum() + x.unfold(1, 2, 1)[1, 3, 1]),
    ("grouped and depthwise convolutions (a loop of ungrouped ones), with backwards", [(2, 4, 6, 6), (4, 1, 3, 3), (6, 2, 3, 3), (6,)],
     lambda x, wd, wg, b: F.conv2d(x, wd, padding=1, groups=4) + F.conv2d(x, wg, b, padding=1, stride=1, groups=2)[:, 1:5]),
    ("nearest upsampling by whole factors (scale 2, size 3x), with backward", [(2, 3, 4, 5)],
     lambda x: F.interpolate(x, scale_factor=2)[:, :, :6, :6] + F.interpolate(x, size=(12, 15))[:, :, :6, :6]),
    ("nearest and nearest-exact upsampling by any size over 1, 2 and 3 dimensions (and down), with backwards",
     [(2, 3, 4, 5)],
     lambda x: torch.cat([F.interpolate(x, size=(7, 9)).flatten(), F.interpolate(x, scale_factor=1.7).flatten(),
                          F.interpolate(x, size=(3, 2), mode="nearest-exact").flatten(),
                          F.interpolate(x, scale_factor=2, mode="nearest-exact").flatten(),
                          F.interpolate(x[0], size=11).flatten(), F.interpolate(x[0], size=13, mode="nearest-exact").flatten(),
                          F.interpolate(x[0], scale_factor=2).flatten(),
                          F.interpolate(x[None], size=(3, 6, 7)).flatten(),
                          F.interpolate(x[None], scale_factor=1.5, mode="nearest-exact").flatten()])),
    ("linear (1-D) and trilinear (3-D) upsampling: a size, a scale, align_corners, and down, with backwards", [(2, 3, 4, 5)],
     lambda x: torch.cat([F.interpolate(x[0], size=11, mode="linear").flatten(),
                          F.interpolate(x[0], scale_factor=1.5, mode="linear", align_corners=True).flatten(),
                          F.interpolate(x[0], size=3, mode="linear").flatten(),
                          F.interpolate(x[None], size=(5, 7, 9), mode="trilinear").flatten(),
                          F.interpolate(x[None], scale_factor=2, mode="trilinear", align_corners=True).flatten(),
                          F.interpolate(x[None], size=(2, 3, 1), mode="trilinear").flatten()])),
    ("cat of f32 with i64 and bool (promoted to f32)", [(2, 3)], lambda x: torch.cat([x, (x > 0).long(), (x < 0)], 0) * x.sum()),
    ("avg_pool2d leaving the padding out of the divisor (count_include_pad=False), with backward", [(2, 3, 7, 6)],
     lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False) + F.avg_pool2d(x, (2, 3), (2, 2), (1, 1), count_include_pad=False)[:, :, :4, :3]),
    ("masked_select, and its backward (masked_scatter)", [(4, 5), (5,)],
     lambda x, b: x.masked_select(b > 0) * 2),
    ("nll_loss reduction none", [(6, 4)], lambda x: F.nll_loss(F.log_softmax(x, 1), (x[:, 0] > x[:, 1]).long(), reduction="none")),
    # PyTorch 1.13 differentiates label smoothing's products through a float64 number.
    ("cross_entropy with label smoothing", [(6, 4)],
     lambda x: F.cross_entropy(x, (x[:, 0] > x[:, 1]).long(), label_smoothing=0.1)),
    ("mul.Scalar and div.Scalar, as C++ calls them", [(4, 5)],
     lambda x: torch.ops.aten.div.Scalar(torch.ops.aten.mul.Scalar(x, 0.3), 7).sum() * torch.ops.aten.mul.Scalar(x, 2.5)),
    ("cross_entropy per position (segmentation: [N, C, H, W], [N, C, d]), weights, none, ignore_index", [(2, 3, 4, 5), (3, 4, 6)],
     lambda x, y: F.cross_entropy(x, (x[:, 0] > x[:, 1]).long() + (x[:, 2] > 1).long(), weight=torch.tensor([1.0, 2.0, 0.5], device=x.device))
     + F.cross_entropy(y, (y[:, 0] > 0).long().masked_fill(y[:, 1] > 1, -100), reduction="none").sum()
     + F.nll_loss(F.log_softmax(x, 1), (x[:, 1] > 0).long(), reduction="sum")),
    ("cross_entropy with class weights", [(6, 4)],
     lambda x: F.cross_entropy(x, (x[:, 0] > x[:, 1]).long(), weight=torch.tensor([1.0, 2.0, 0.5, 1.5], device=x.device))),
    ("triu and tril over a batch (diagonals 1, -1, 0), and a bool causal mask", [(2, 4, 5)],
     lambda x: x.triu(1) + x.tril(-1) * 2 + x.transpose(1, 2).tril().transpose(1, 2)
     + x.masked_fill(torch.ones(4, 5, dtype=torch.bool, device=x.device).triu(1), 0.5)),
    ("roll along one dim, two dims, and flattened", [(3, 4)], lambda x: x.roll(1, 1) + x.roll((2, -1), (0, 1)) * 2 + x.roll(5)),
    ("std_mean and var_mean", [(3, 5)],
     lambda x: torch.cat([torch.std_mean(x, 1)[0], torch.std_mean(x, 1)[1], torch.var_mean(x, 0, unbiased=False)[0]])),
    ("special.xlog1py with zeros and a NaN, special.entr (positive, zero, negative, NaN), with backwards", [(4, 5), (4, 5)],
     lambda x, y: torch.special.xlog1py(torch.relu(y), x.abs() - 0.5) + torch.special.entr(x.abs() + 0.1)
     + torch.nan_to_num(torch.special.xlog1py(torch.tensor([0.0, 2.0, 0.0, 1.0, 3.0], device=x.device),
                                              torch.tensor([NAN, NAN, 1.0, 0.0, -0.5], device=x.device))
                        + torch.special.entr(torch.tensor([0.5, 0.0, -1.0, NAN, 2.0], device=x.device)), nan=7.0, neginf=-9.0)),
    ("logsigmoid, xlogy with zeros, kl_div", [(4, 5), (4, 5)],
     lambda x, y: F.logsigmoid(x * 4) + torch.xlogy(torch.relu(y), x.abs() + 0.1)
     + F.kl_div(F.log_softmax(x, 1), F.softmax(y, 1), reduction="none")),
    ("group_norm with weight and bias, and without", [(2, 6, 3, 3), (6,), (6,)],
     lambda x, w, b: F.group_norm(x, 3, w, b) + F.group_norm(x * 2, 2)),
    ("floor, ceil, round (halves to even), trunc, frac", [(4, 6)],
     lambda x: torch.cat([(x * 2).floor(), (x * 2).ceil(), (x * 2).round(), torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, 3.5]], device=x.device).round(),
                          (x * 2).trunc(), (x * 2).frac() * x])),
    ("sin, cos, tan, asin, acos, atan, sinh, cosh, with backwards (a sinusoidal encoding)", [(4, 6)],
     lambda x: x.sin() + x.cos() * 2 + (x * 0.3).tan() + (x.tanh() * 0.9).asin() + (x.tanh() * 0.9).acos() + x.atan()
     + x.sinh() + x.cosh() + torch.sin(torch.arange(6.0, device=x.device) * x[:1].exp())),
    ("erf, erfc, expm1, log2, log10, exp2, with backwards (an erf GELU)", [(4, 6)],
     lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5)) + x.erfc() + x.expm1() + (x.abs() + 0.5).log2()
     + (x.abs() + 0.5).log10() + x.exp2()),
    ("x[a, :, c] (index tensors apart: the picked dimensions first), and its backward", [(4, 5, 3)],
     lambda x: x[torch.tensor([0, 3, 1], device=x.device), :, torch.tensor([2, 0, 2], device=x.device)] * 2),
    ("puts into a transpose and with indices apart, with and without accumulate", [(4, 5, 3), (3, 5)],
     lambda x, v: torch.cat([put(x.transpose(0, 2), (torch.tensor([2, 0, 1], device=x.device),), v.unsqueeze(-1) * 3).flatten(),
                             x.transpose(0, 2).index_put((torch.tensor([1, 1], device=x.device),), v[:2].unsqueeze(-1),
                                                         accumulate=True).flatten(),
                             put(x, (torch.tensor([0, 3], device=x.device), slice(None), torch.tensor([1, 2], device=x.device)),
                                 v[:2]).flatten()])),
    ("repeat_interleave by a number (GQA's heads) and by a tensor, with backward", [(3, 4)],
     lambda x: torch.cat([x.repeat_interleave(2, 0), x.repeat_interleave(torch.tensor([1, 0, 2], device=x.device), dim=0),
                          x.repeat_interleave(3, 1).reshape(9, 4)])),
    ("embedding_bag sum and mean: offsets with an empty bag, padding_idx, per-sample weights, 2-D input", [(10, 4), (9,)],
     lambda w, p: torch.cat([
         F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0], device=w.device), w,
                         torch.tensor([0, 4, 4, 6], device=w.device), mode="mean", padding_idx=4),
         F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0], device=w.device), w,
                         torch.tensor([0, 4, 4, 6, 9], device=w.device), mode="sum", per_sample_weights=p,
                         include_last_offset=True),
         F.embedding_bag(torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]], device=w.device), w)])),
    ("cummax and cummin along each dim (ties to the later position, a NaN kept), values, positions, backward", [(5, 9)],
     lambda x: torch.cat([x.cummax(1).values, x.round().cummin(0).values, x.masked_fill(x > 1.5, float("nan")).cummax(1).values.nan_to_num(7.0),
                          x.round().cummax(1).indices.float(), x.masked_fill(x < -1, float("nan")).cummin(1).indices.float()])),
    ("nan_to_num with its defaults and with numbers given, and its backward", [(4, 5)],
     lambda x: torch.cat([(x + torch.tensor([float("inf"), -float("inf"), float("nan"), 0, 0], device=x.device)).nan_to_num(),
                          (x * 2 + torch.tensor([0, float("nan"), -float("inf"), float("inf"), 0], device=x.device))
                          .nan_to_num(1.0, 2.0, -3.0)])),
    ("a number minus a tensor (1 - x, rsub with alpha, of i64 too) and multilabel soft margin", [(4, 6)],
     lambda x: (1 - x) * 2 + torch.rsub(x, 2.5, alpha=3) + (7 - (x * 3).long()).float()
     + F.multilabel_soft_margin_loss(x, (x > 0).float())),
    ("mv, addmv and dot (x @ v), with backwards", [(5, 4), (4,), (5,)],
     lambda m, v, s: torch.cat([m @ v, torch.addmv(s, m, v, beta=0.5, alpha=2), (v @ v).reshape(1), (s @ (m @ v)).reshape(1)])),
    ("clamp and lerp by tensors, trace, diag both ways, with backwards", [(4, 6), (6,), (4, 6)],
     lambda x, lo, w: torch.cat([x.clamp(lo - 0.5, lo + 1).flatten(), x.clamp(max=lo).flatten(),
                                 torch.lerp(x, x * 3, w.sigmoid() * 2 - 0.5).flatten(), x[:, :4].trace().reshape(1),
                                 x.diag(1), lo.diag(-1).flatten()])),
    ("xor, count_nonzero and neg of i64 (no gradient)", [(4, 6)],
     lambda x: torch.cat([((x > 0) ^ (x < 1)).float().flatten(), torch.logical_xor(x.long(), x > 0).float().flatten(),
                          (x > 0).count_nonzero(1).float(), (-(x * 1e6).long()).float().flatten()])),
    ("replication padding 1-d and 2-d (conv's padding_mode='replicate'), with backwards", [(2, 3, 5), (1, 2, 4, 5)],
     lambda x, y: F.pad(x, (2, 3), mode="replicate").sum(1)[:, :5] + F.pad(y, (1, 2, 3, 0), mode="replicate")[0, :, :5, :5].sum(0)[:1]
     + F.conv2d(F.pad(y, (1, 1, 1, 1), mode="replicate"), torch.ones(1, 2, 3, 3, device=y.device))[0, :, :1, :5]),
    ("F.unfold and F.fold (im2col, col2im: dilation, padding, strides; unbatched), with backwards", [(2, 3, 6, 7)],
     lambda x: torch.cat([F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=(2, 1)).flatten(),
                          F.fold(F.unfold(x, 3, padding=1), (6, 7), 3, padding=1).flatten(),
                          F.fold(F.unfold(x[0], 2, stride=2) * 2, (6, 7), 2, stride=2).flatten()])),
    ("atan2, hypot, copysign, fmod, remainder, floor and trunc division (tensors and numbers), with backwards", [(4, 6), (4, 6)],
     lambda a, b: torch.cat([torch.atan2(a, b), torch.hypot(a, b), torch.copysign(a, b), torch.fmod(a * 3, b.abs() + 0.5),
                             (a * 3) % (b.abs() + 0.5), (a * 3) % -0.7, ((a * 3) // (b.abs() + 0.5)).detach(), ((a * 3) // 0.3).detach(),
                             torch.div(a * 3, b, rounding_mode="trunc")])),
    ("prod along each dim, kept, of all, over an empty dim, of i64 and bool (exact), with backwards", [(3, 5)],
     lambda x: torch.cat([x.prod(1), x.prod(0, keepdim=True).flatten(), x.prod().reshape(1), x[:, :0].prod(1),
                          (x * 3).long().prod(1).float(), (x > -1).prod(0).float()])),
    ("heaviside; i64 maximum, minimum and clamp (exact); i64 clamped by a fraction (f32)", [(4, 6)],
     lambda x: torch.cat([torch.heaviside(x.detach().round(), torch.tensor(0.25, device=x.device)).flatten(),
                          torch.maximum((x * 1e6).long(), (x.flip(0) * 1e6).long()).float().flatten(),
                          torch.minimum((x * 1e6).long(), (x.flip(1) * 1e6).long()).float().flatten(),
                          (x * 4).long().clamp(-2, 3).float().flatten(), (x * 4).long().clamp(min=0).float().flatten(),
                          (x * 4).long().clamp(-2.5, 1.5).flatten()])),
    ("bucketize and searchsorted (left, right; a NaN past the end), nonzero, argwhere, where(mask), x[mask]", [(4, 6)],
     lambda x: torch.cat([torch.bucketize(x, torch.tensor([-1.0, 0.0, 0.5], device=x.device)).float().flatten(),
                          torch.bucketize(torch.cat([x.flatten().round(), torch.tensor([float("nan")], device=x.device)]),
                                          torch.tensor([-1.0, 0.0, 0.0, 1.0], device=x.device), right=True).float(),
                          torch.searchsorted(torch.tensor([-0.5, 0.5], device=x.device), x, side="right").float().flatten(),
                          torch.nonzero((x * 2).long()).float().flatten(), torch.argwhere(x > 0.5).float().flatten(),
                          torch.stack(torch.where(x < -0.5)).float().flatten(), x[x > 0]])),
    ("i64 // and % (floor, the divisor's sign), fmod, trunc division by numbers and tensors, exact past 2^24 (i64 out)",
     [(4, 6)],
     lambda x: (lambda a, d: torch.cat([a // 3, a % -7, a // d, a % d, torch.fmod(a, d), torch.fmod(a, -5),
                                        torch.div(a, d, rounding_mode="trunc"), torch.div(a, 9, rounding_mode="floor")]))(
         (x * 1e6).long() * 1000, (x * 4).long() + ((x * 4).long() >= 0).long())),
    ("i64 // and % by a fraction (f32 out)", [(4, 6)],
     lambda x: torch.cat([(x * 4).long() // 2.5, (x * 4).long() % 2.5, (x * 4).long() % -1.5])),
    ("unique of f32 and i64 with inverse and counts (sorted)", [(5, 6)],
     lambda x: (lambda r, i: torch.cat([r[0], r[1].flatten().float(), r[2].float(), i[0].float(), i[1].float()]))(
         torch.unique((x.detach() * 2).round(), return_inverse=True, return_counts=True),
         torch.unique((x.detach() * 3).long(), return_counts=True))),
    ("adaptive_max_pool2d over even windows, batched and not, with backwards", [(2, 3, 8, 6)],
     lambda x: torch.cat([F.adaptive_max_pool2d(x, (4, 3)).flatten(), F.adaptive_max_pool2d(x[0], 2).flatten()])),
    ("adaptive_max_pool2d over uneven windows (overlapping, larger than the input, ties after a relu), with indices and "
     "backwards", [(2, 3, 7, 10)],
     lambda x: (lambda r: torch.cat([F.adaptive_max_pool2d(x, (3, 4)).flatten(), F.adaptive_max_pool2d(x[0], (9, 13)).flatten(),
                                     F.adaptive_max_pool2d(r, (4, 3)).flatten(),
                                     F.adaptive_max_pool2d(r.detach(), (3, 4), return_indices=True)[1].flatten().float()]))(
         F.relu(x - 1))),
    ("lgamma, erfinv, digamma and polygamma with backwards (lgamma's is digamma, digamma's polygamma(1))", [(4, 6)],
     lambda x: torch.cat([torch.lgamma(x * 3), torch.lgamma(x.abs() + 0.05), torch.erfinv(x.tanh() * 0.95),
                          torch.digamma(x * 3), torch.special.digamma(x.abs() * 10 + 0.01),
                          torch.polygamma(1, x.abs() + 0.3), torch.polygamma(2, x * 2.2), torch.special.polygamma(3, x.abs() + 1)])),
    ("cdist p=2 and p=1 (a shared row: distance 0), batched, with backwards; p=inf, p=3 and p=0", [(5, 3), (4, 3), (2, 5, 3)],
     lambda a, b, c: torch.cat([torch.cdist(a, torch.cat([b, a[:1]])).flatten(), torch.cdist(a, b, p=1).flatten(),
                                torch.cdist(c, c[:, :3] * 2).flatten(), torch.cdist(a.detach(), b.detach(), p=float("inf")).flatten(),
                                torch.cdist(a.detach(), b.detach(), p=3).flatten(), torch.cdist(a.detach().round(), b.detach().round(), p=0).flatten()])),
    ("logaddexp and logaddexp2 (the same infinity twice), sinc (at 0), softshrink, hardshrink, threshold, logit, with backwards",
     [(4, 6), (4, 6)],
     lambda a, b: (lambda inf: torch.cat([t.flatten() for t in (
         torch.logaddexp(a, b * 3), torch.logaddexp2(a * 2, b),
         torch.logaddexp(torch.cat([inf, -inf, inf]), torch.cat([inf, -inf, -inf])) == torch.cat([inf, -inf, inf]),
         torch.sinc(torch.cat([a, a * 0])), F.softshrink(a, 0.4), F.hardshrink(b, 0.3), F.threshold(a, 0.2, -5.0),
         torch.logit(torch.sigmoid(a)), torch.logit(torch.sigmoid(b * 4), eps=0.05))]))(
         torch.tensor([float("inf")], device=a.device))),
    ("unique_consecutive of i64 and f32 (each NaN a run of its own), with inverse and counts, and of one element", [(4, 6)],
     lambda x: torch.cat([t.float().flatten() for t in (
         *torch.unique_consecutive((x.detach() * 0.8).round().clamp(-1, 1).long(), return_inverse=True, return_counts=True),
         *torch.unique_consecutive(torch.nan_to_num((x.detach() * 0.5).round().t() / (x.detach().t() > -1.2), nan=5.0),
                                   return_counts=True),
         torch.nan_to_num(torch.unique_consecutive(torch.tensor([1.0, NAN, NAN, 2.0, 2.0], device=x.device)), nan=9.0),
         torch.unique_consecutive(x.detach()[0, :1]))])),
    ("histc (a given range, the input's own), bincount (minlength; weighted), take (picks from the end; its backward puts), isin",
     [(5, 8)],
     lambda x: torch.cat([torch.histc(x.detach(), 7, -1.5, 1.5), torch.histc(x.detach() * 10, 5),
                          torch.bincount((x.detach() * 3).abs().long().flatten(), minlength=20).float(),
                          torch.bincount((x.detach() * 3).abs().long().flatten(), x.detach().flatten()),
                          torch.bincount((x.detach() * 3).abs().long()[0], x.detach()[1], minlength=30),
                          torch.take(x, torch.tensor([[0, -1], [7, -40]], device=x.device)).flatten(),
                          torch.isin(x.detach().round(), torch.tensor([0.0, 2.0], device=x.device)).float().flatten(),
                          torch.isin((x.detach() * 4).long(), (x.detach()[0] * 4).long(), invert=True).float().flatten()])),
    ("linspace, logspace and eye (made on the host, written to the card)", [(3,)],
     lambda x: torch.cat([torch.linspace(-1, 2, 7, device=x.device), torch.logspace(0, 2, 5, base=2, device=x.device),
                          torch.eye(3, 4, device=x.device).flatten(), torch.linspace(0, 1, 5, device=x.device) * x.sum()])),
    ("grid_sample: bilinear with zeros and with border (align_corners both ways), nearest; with backwards", [(2, 3, 5, 6), (2, 4, 5, 2)],
     lambda x, g: torch.cat([F.grid_sample(x, g.tanh() * 1.2, align_corners=False).flatten(),
                             F.grid_sample(x, g.tanh() * 1.1, padding_mode="border", align_corners=True).flatten(),
                             F.grid_sample(x, g.tanh() * 0.9, padding_mode="border", align_corners=False).flatten(),
                             F.grid_sample(x, g.detach() * 0.7, mode="nearest", align_corners=False).flatten()])),
    ("multi_margin_loss: p 1 and 2, a margin, class weights, each reduction, one row alone", [(4, 5), (5,)],
     lambda x, w: (lambda t: torch.cat([F.multi_margin_loss(x, t).reshape(1), F.multi_margin_loss(x, t, p=2, margin=0.7, reduction="sum").reshape(1),
                                        F.multi_margin_loss(x * 0.3, t, weight=w.detach().abs(), reduction="none"),
                                        F.multi_margin_loss(x[1] * 0.2, t[1:2], margin=0.5).reshape(1)]))(
         torch.tensor([1, 4, 0, 1], device=x.device))),
    ("multilabel_margin_loss: targets ended by -1 (entries after it ignored, one listed twice, a row of none), "
     "each reduction, one row alone", [(4, 5)],
     lambda x: (lambda t: torch.cat([F.multilabel_margin_loss(x, t).reshape(1),
                                     F.multilabel_margin_loss(x * 0.5, t, reduction="sum").reshape(1),
                                     F.multilabel_margin_loss(x * 0.3, t, reduction="none"),
                                     F.multilabel_margin_loss(x[0], t[0]).reshape(1)]))(
         torch.tensor([[3, 0, -1, 1, 4], [2, 2, 4, -1, -1], [-1, 1, 2, 3, 4], [0, 1, 2, 3, 4]], device=x.device))),
    ("grid_sample with reflection padding: bilinear (align_corners both ways, points folded once and more), nearest; "
     "with backwards", [(2, 3, 5, 6), (2, 4, 5, 2)],
     lambda x, g: torch.cat([F.grid_sample(x, g * 1.5, padding_mode="reflection", align_corners=False).flatten(),
                             F.grid_sample(x, g * 2.5, padding_mode="reflection", align_corners=True).flatten(),
                             F.grid_sample(x[:, :, :1], g * 1.3, padding_mode="reflection", align_corners=True).flatten(),
                             F.grid_sample(x, g.detach() * 1.7, mode="nearest", padding_mode="reflection",
                                           align_corners=False).flatten()])),
    ("weight norm over the first dim and the last, with backwards; channel_shuffle", [(4, 3, 2), (4,), (2,)],
     lambda v, g0, g1: torch.cat([torch._weight_norm(v, g0.view(4, 1, 1), 0).flatten(),
                                  torch._weight_norm(v * 2, g1.view(1, 1, 2), 2).flatten(),
                                  F.channel_shuffle(v.detach().reshape(2, 4, 3), 2).flatten()])),
    ("conv3d (stride, padding, dilation; grouped, with bias; a 1x1x1), with backwards", [(2, 4, 5, 6, 5), (6, 2, 3, 2, 3), (6,)],
     lambda x, w, b: torch.cat([F.conv3d(x, w, b, stride=(2, 1, 1), padding=(1, 0, 1), dilation=(1, 2, 1), groups=2).flatten(),
                                F.conv3d(x, w[:, :, :1, :1, :1].repeat(1, 2, 1, 1, 1)).flatten()])),
    ("3-D pooling: max (padded, dilated, strided; with indices), average (padded, a divisor given), adaptive average; backwards",
     [(2, 3, 6, 5, 7)],
     lambda x: (lambda m, i: torch.cat([m.flatten(), i.float().flatten(),
                                        F.max_pool3d(x, 2).flatten(),
                                        F.avg_pool3d(x, (3, 2, 3), stride=(2, 1, 2), padding=(1, 1, 0)).flatten(),
                                        F.avg_pool3d(x, 2, divisor_override=3).flatten(),
                                        F.adaptive_avg_pool3d(x, (3, 5, 1)).flatten()]))(
         *F.max_pool3d(x, (3, 2, 3), stride=(2, 2, 1), padding=(1, 1, 1), dilation=(1, 2, 1), return_indices=True))),
    ("3-D max pooling with ceil_mode (plain, padded, uneven), with indices and backwards", [(2, 3, 5, 7, 6)],
     lambda x: (lambda m, i: torch.cat([m.flatten(), i.float().flatten(), F.max_pool3d(x, 2, ceil_mode=True).flatten(),
                                        F.max_pool3d(x, 3, 2, 1, ceil_mode=True).flatten()]))(
         *F.max_pool3d(x, (3, 2, 2), stride=(2, 2, 3), padding=(1, 0, 1), ceil_mode=True, return_indices=True))),
    ("i64 powers (exact past 2^24), i64 and bool against f32 (f32 compares), signbit (-0.0), isposinf, isneginf, fmin, fmax (NaN ignored)",
     [(4, 6)],
     lambda x: (lambda n, s: torch.cat([t.float().flatten() for t in (
         n ** 3, n ** 0, n ** 1, (n < x), (x >= n), (n > 0.5), (x > 0) == x, torch.signbit(s), torch.isposinf(s), torch.isneginf(s),
         torch.fmin(s, x[:, :3].detach()).nan_to_num(7.0), torch.fmax(s, x[:, :3].detach()).nan_to_num(7.0))]))(
         (x.detach() * 1e3).long(),
         torch.cat([x.detach()[:, :1], torch.tensor([[-0.0, float("nan"), float("inf")], [0.0, -float("inf"), 1.0],
                                                     [float("nan"), 2.0, -0.0], [3.0, 3.0, 3.0]], device=x.device)[:, :2]], 1)
         .repeat(1, 2)[:, :3])),
    ("nansum, nanmean, aminmax, renorm (its backward, in f64, is the host's), tril_indices, triu_indices", [(4, 6)],
     lambda x: (lambda y: torch.cat([t.float().flatten() for t in (
         torch.nansum(y, 1), torch.nanmean(y, 0), torch.nansum(y), *torch.aminmax(x.detach(), dim=1), *torch.aminmax(x.detach()),
         torch.renorm(x.detach(), 2, 0, 1.5), torch.renorm(x.detach(), 1, 1, 0.8), torch.tril_indices(4, 3, device=x.device),
         torch.triu_indices(3, 5, 1, device=x.device))]))(
         torch.where(x > 1, torch.tensor(float("nan"), device=x.device), x))),
    ("pdist p=2 and p=1 with backwards, p=3", [(5, 3)],
     lambda x: torch.cat([F.pdist(x), F.pdist(x * 2, 1), F.pdist(x.detach(), 3)])),
    ("i64 bits: &, |, ^, ~ (tensors and numbers), << and >> (tensors, numbers, in place; the sign kept)", [(4, 6)],
     lambda x: (lambda a, b: torch.cat([t.float().flatten() for t in (
         a & b, a | b, a ^ b, ~a, a & 0xFF, a | 1, a ^ -3, a << b, a >> b, a << 3, a >> 2, (a.clone() << 1).__irshift__(2))]))(
         (x.detach() * 1e6).long(), (x.detach().abs() * 10).long() % 20)),
    ("embedding with max_norm (rows picked twice; 2-norm and 1-norm), with backward", [(6, 4)],
     lambda w: torch.cat([F.embedding(torch.tensor([[1, 3, 1], [5, 0, 3]], device=w.device), w * 2, max_norm=1.0).flatten(),
                          F.embedding(torch.tensor([2, 2, 4], device=w.device), w * 1, max_norm=0.5, norm_type=1).flatten()])),
    ("max_unpool2d of max_pool2d's indices (windows apart, and overlapping: a position named twice), with backwards",
     [(2, 3, 6, 6)],
     lambda x: torch.cat([F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2).flatten(),
                          F.max_unpool2d(*F.max_pool2d(x, 3, stride=1, return_indices=True), 3, stride=1).flatten(),
                          F.max_unpool2d(*F.max_pool2d(x[0], 2, return_indices=True), 2).flatten()])),
    ("cholesky (lower, upper; a batch and one matrix), cholesky_solve both ways, with backwards", [(2, 4, 4), (2, 4, 3)],
     lambda a, b: (lambda spd: torch.cat([torch.linalg.cholesky(spd).flatten(), torch.linalg.cholesky(spd[1], upper=True).flatten(),
                                          torch.cholesky_solve(b, torch.linalg.cholesky(spd)).flatten(),
                                          torch.cholesky_solve(b, torch.linalg.cholesky(spd, upper=True), upper=True).flatten()]))(
         a @ a.mT + 4 * torch.eye(4, device=a.device))),
    ("solve (matrices, a vector, right-hand), inv, det (of A and of its transpose), slogdet, logdet, with backwards",
     [(2, 4, 4), (2, 4, 3)],
     lambda a, b: (lambda m: torch.cat([torch.linalg.solve(m, b).flatten(), torch.linalg.solve(m, b[..., 0]).flatten(),
                                        torch.linalg.solve(m, b.mT, left=False).flatten(), torch.linalg.inv(m).flatten(),
                                        torch.linalg.det(m), torch.linalg.det(m.mT), torch.linalg.slogdet(m)[1],
                                        torch.linalg.slogdet(m)[0], torch.logdet(m @ m.mT)]))(
         a + 3 * torch.eye(4, device=a.device))),
    ("solve_triangular (lower, upper, unit, right-hand), lu_factor + lu_solve (and adjoint), linalg.lu, with backwards",
     [(2, 4, 4), (2, 4, 3)],
     lambda a, b: (lambda m: torch.cat([torch.linalg.solve_triangular(m.tril(), b, upper=False).flatten(),
                                        torch.linalg.solve_triangular(m.triu(), b, upper=True).flatten(),
                                        torch.linalg.solve_triangular(m, b, upper=False, unitriangular=True).flatten(),
                                        torch.linalg.solve_triangular(m.triu(), b.mT, upper=True, left=False).flatten(),
                                        torch.linalg.lu_solve(*torch.linalg.lu_factor(m), b).flatten(),
                                        torch.linalg.lu_solve(*torch.linalg.lu_factor(m), b, adjoint=True).flatten(),
                                        torch.cat([t.flatten() for t in torch.linalg.lu(m)])]))(
         a + 3 * torch.eye(4, device=a.device))),
    ("qr (reduced: tall, wide, a batch; complete and r), geqrf + householder_product, with backwards", [(2, 5, 3)],
     lambda a: torch.cat([torch.cat([t.flatten() for t in torch.linalg.qr(a)]),
                          torch.cat([t.flatten() for t in torch.linalg.qr(a.mT * 2)]),
                          torch.cat([t.flatten() for t in torch.linalg.qr(a[0].detach(), mode="complete")]),
                          torch.linalg.qr(a[1].detach(), mode="r")[1].flatten(),
                          torch.cat([t.flatten() for t in torch.geqrf(a.detach())]),
                          torch.linalg.householder_product(*torch.geqrf(a.detach())).flatten(),
                          torch.linalg.householder_product(a[0].detach(), a[1, 0, :2].detach()).flatten()])),
    ("eigh (lower and upper: its values, its vectors' squares), eigvalsh, with backwards", [(2, 5, 5), (4, 4)],
     lambda a, b: (lambda m, u: torch.cat([torch.linalg.eigh(m)[0].flatten(), (torch.linalg.eigh(m)[1] ** 2).flatten(),
                                           torch.linalg.eigh(u, UPLO="U")[0], torch.linalg.eigvalsh(m).flatten(),
                                           torch.linalg.eigvalsh(u, UPLO="U")]))(a + a.mT, b.triu() * 3)),
    ("svd (tall, wide, a batch: S and the vectors' squares; full_matrices: U U^T = I), svdvals, 2-norm, "
     "nuclear norm, with backwards", [(2, 5, 3), (3, 4)],
     lambda a, b: torch.cat([torch.cat([t.flatten() ** 2 for t in torch.linalg.svd(a, full_matrices=False)]),
                             torch.cat([t.flatten() ** 2 for t in torch.linalg.svd(b, full_matrices=False)]),
                             (lambda u: (u @ u.mT).flatten())(torch.linalg.svd(a[0].detach())[0]),
                             (lambda vh: (vh @ vh.mT).flatten())(torch.linalg.svd(b.detach())[2]),
                             torch.linalg.svdvals(a * 2).flatten(), torch.linalg.matrix_norm(b, ord=2).reshape(1),
                             torch.linalg.matrix_norm(a, ord="nuc").flatten()])),
    ("matrix_exp (a batch; a 1-norm past 1: squarings), orthogonal's householder map (f32 times int32), with backwards",
     [(2, 4, 4), (5, 3)],
     lambda a, x: (lambda A: torch.cat([torch.linalg.matrix_exp(a * 0.3).flatten(), torch.matrix_exp(a[0] * 3).flatten(),
                                        (torch.linalg.householder_product(A, 2. / (1. + (A * A).sum(dim=-2))) *
                                         x.diagonal().sign().int().unsqueeze(-2)).flatten()]))(x.tril(-1))),
    ("lstsq (tall, with gels' residuals; wide: the least-norm solution; a vector, its residuals and their shape; a batch)",
     [(2, 5, 3), (2, 5, 2), (3, 5)],
     lambda a, b, w: (lambda a, b, w, r: torch.cat([torch.linalg.lstsq(a, b).solution.flatten(),
                                                    torch.linalg.lstsq(a, b[..., 0]).solution.flatten(),
                                                    torch.linalg.lstsq(a, b, driver="gels").residuals.flatten(),
                                                    r.flatten(), torch.tensor(r.shape, dtype=torch.float32, device=r.device),
                                                    torch.linalg.lstsq(w, b[0, :3]).solution.flatten()]))(
         a.detach(), b.detach(), w.detach(), torch.linalg.lstsq(a.detach(), b.detach()[..., 0], driver="gels").residuals)),
    ("ctc_loss (padded and concatenated targets, an empty one, one too long with zero_infinity; none, sum, mean), "
     "with backwards", [(6, 3, 5)],
     lambda x: (lambda lp, padded, flat: torch.cat([
         F.ctc_loss(lp, padded, (6, 5, 4), (3, 2, 0), reduction="none"),
         F.ctc_loss(lp, flat, torch.tensor([6, 5, 4]), torch.tensor([3, 2, 2]), reduction="sum").reshape(1),
         F.ctc_loss(lp * 0.5, padded, (6, 5, 4), (3, 2, 3), zero_infinity=True).reshape(1),
         F.ctc_loss(lp.log_softmax(2), padded, (6, 6, 6), (3, 2, 3), blank=4, reduction="none")]))(
         x.log_softmax(2), torch.tensor([[1, 2, 2], [3, 1, 0], [1, 1, 1]], device=x.device),
         torch.tensor([1, 2, 2, 3, 1, 2, 3], device=x.device))),
    ("MultivariateNormal's log_prob (covariance and scale_tril), linalg.cross, with backwards", [(4,), (4, 4), (3, 4), (5, 3)],
     lambda mu, a, x, c: torch.cat([
         torch.distributions.MultivariateNormal(mu, a @ a.mT + torch.eye(4, device=a.device)).log_prob(x),
         torch.distributions.MultivariateNormal(mu, scale_tril=a.tril() * 0.1 + torch.eye(4, device=a.device)).log_prob(x),
         torch.linalg.cross(c, c.flip(0)).flatten(), torch.linalg.cross(c.mT, c.mT * 2 + 1, dim=0).flatten()])),
    ("gcd and lcm of i64 (signs, zeros, in place), ldexp (2 to i64 powers), a sort of bool both ways", [(4, 6)],
     lambda x: (lambda a, b: torch.cat([torch.gcd(a, b).float(), torch.lcm(a, b).float(), a.clone().gcd_(b).float(),
                                        torch.ldexp(x.detach().flatten(), b % 7 - 3),
                                        torch.sort(x.detach() > 0, 1)[0].float().flatten(),
                                        torch.sort(x.detach() > 0, 0, descending=True)[1].float().flatten()]))(
         (x.detach().flatten() * 40).long(), (x.detach().flip(0).flatten() * 30).long())),
    ("scatter_reduce (sum, mean, amax, amin, prod; with and without self), index_reduce, scatter with repeated picks "
     "(the last wins) and with reduce, with backwards", [(3, 4), (6, 4)],
     lambda s, x: (lambda i2, i1: torch.cat([
         s.scatter_reduce(0, i2, x, "sum").flatten(), s.scatter_reduce(0, i2, x, "mean", include_self=False).flatten(),
         s.scatter_reduce(0, i2, x, "amax").flatten(), s.scatter_reduce(0, i2, x, "amin", include_self=False).flatten(),
         s.scatter_reduce(0, i2, x, "prod").flatten(), s.index_reduce(0, i1, x, "amax", include_self=False).flatten(),
         s.index_reduce(0, i1, x, "mean").flatten(), s.scatter(0, i2, x).flatten(),
         s.detach().scatter(0, i2, x.detach(), reduce="multiply").flatten(), s.detach().scatter(0, i2, x.detach(), reduce="add").flatten()]))(
         torch.tensor([0, 2, 2, 1, 0, 2], device=s.device).view(6, 1).expand(6, 4), torch.tensor([0, 2, 2, 1, 0, 2], device=s.device))),
    ("nanmedian of all and over each dim (NaNs in some rows, one row all NaN: its NaN as -7), with backwards", [(4, 5)],
     lambda x: (lambda y: torch.nan_to_num(torch.cat([torch.nanmedian(y).view(1), torch.nanmedian(y, 1)[0],
                                                      torch.nanmedian(y[::2], 1)[1].float(),
                                                      torch.nanmedian(y, 0, keepdim=True)[0].flatten()]), nan=-7.0))(
         torch.where(torch.tensor([[0, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]], device=x.device).bool(),
                     torch.full_like(x, float("nan")), x))),
    ("logcumsumexp along each dim (values far apart, -inf), with backwards", [(6, 5)],
     lambda x: torch.cat([torch.logcumsumexp(x * 30, 0).flatten(), torch.logcumsumexp(x, 1).flatten(),
                          torch.logcumsumexp(torch.cat([torch.full((1, 5), float("-inf"), device=x.device), x]), 0)[1:].flatten()])),
    ("index puts of i64 and bool whose picks meet (the last wins), into a transpose too; a scatter of i64 src", [(4, 5)],
     lambda x: (lambda t, i: torch.cat([
         t.clone().index_put_((i,), torch.tensor([[2**50 + 1] * 5, [7] * 5, [-2**45] * 5], device=x.device)).flatten(),
         t.t().clone().index_put_((i,), torch.full((3, 4), 2**41, dtype=torch.long, device=x.device)).flatten(),
         (t > 0).index_put_((i,), torch.tensor([True], device=x.device)).long().flatten(),
         t.clone().scatter_(1, torch.tensor([[0, 0], [1, 1], [4, 2], [3, 3]], device=x.device), t[:, :2] * 10).flatten()]).float())(
         (x.detach() * 2**40).long(), torch.tensor([1, 3, 1], device=x.device))),
    ("vector norms: 2, 1, inf, 3", [(4, 6)],
     lambda x: torch.linalg.vector_norm(x) + x.norm(1) + torch.linalg.vector_norm(x, 3, dim=1).sum()
     + torch.linalg.vector_norm(x, float("inf")).detach()),
]


def run_case(shapes, fn, device, seed):
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(*s, generator=g) for s in shapes]
    on = [t.to(device).requires_grad_(True) for t in inputs]
    out = fn(*on)
    upstream = torch.randn(out.shape, generator=g)
    if out.requires_grad:
        out.backward(upstream.to(device))
    return out.detach().cpu(), [t.grad.cpu() if t.grad is not None else torch.zeros(t.shape) for t in on]


def close(a, b, rtol, atol):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.double(), b.double()  # bool and i64 results compare exactly
    return bool(((a - b).abs() <= atol + rtol * b.abs()).all())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    args = p.parse_args()
    dev = raccel.torch.device()
    failed = 0
    for name, shapes, fn in CASES:
        seed = zlib.crc32(name.encode())  # a case's inputs stay its own when others come
        want, want_grads = run_case(shapes, fn, "cpu", seed)
        raccel.torch.reset_fallbacks()
        got, got_grads = run_case(shapes, fn, dev, seed)
        fallbacks = raccel.torch.fallbacks()
        ok = close(got, want, args.rtol, args.atol) and all(
            close(a, b, args.rtol, args.atol) for a, b in zip(got_grads, want_grads))
        failed += not ok or bool(fallbacks)
        pairs = [(got, want)] + list(zip(got_grads, want_grads))
        worst = max(float((a.double() - b.double()).abs().max()) if a.shape == b.shape and a.numel() else 0.0 for a, b in pairs)
        print(f"{'ok  ' if ok and not fallbacks else 'FAIL'} {name}: worst difference {worst:.2e}"
              f"{'; fell back: ' + str(fallbacks) if fallbacks else ''}", flush=True)
    print(f"{len(CASES) - failed} of {len(CASES)} cases on the card with the CPU's results")
    print("PASS" if failed == 0 else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
