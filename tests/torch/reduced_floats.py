#!/usr/bin/python3
"""bfloat16 and float16 arithmetic on the raccel device: each op computed in f32 on the card
and rounded once to its type, as PyTorch's CPU computes bf16 (a number operand taken in
the tensor's type first), with nothing falling back to the host.

- bf16 ops against PyTorch's CPU in bf16: bit for bit where the CPU also rounds once
  (arithmetic, numbers as operands, add's alpha, the optimizers' steps, matmuls, sums,
  maxima and their positions, comparisons, softmax), within 2 ulps where the card's f32
  functions differ from the CPU's in their last bits (pooling, resampling and the
  pointwise losses with their backwards among them; an op PyTorch's CPU lacks in bf16,
  or computes in bf16 steps, against the f32 result rounded once); LayerNorm, which PyTorch's CPU
  computes partly in bf16, against the f32 result rounded once.
- f16 ops (PyTorch 1.13's CPU has almost none) against the CPU's f32 result rounded once.
- An op mixing bf16 and f32 gives the CPU's f32 result exactly.
- Random draws (normal_, uniform_, dropout, bernoulli) into bf16 and f16 have their
  moments, are reproducible from torch.manual_seed and stay on the card.
- An MLP (AdamW, LayerNorm, GELU), a CNN (convolutions, batch norm, max pool) and a
  transformer block (embedding, attention, LayerNorm) made bf16 train on the card with the
  CPU's bf16 losses (within 2%: bf16 holds 3 digits) and no fallback.
Prints one line per check and PASS or FAIL; exits 1 on any failure.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import raccel.torch

failures = []


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(what)


def on_card(dev, f, xs):
    raccel.torch.reset_fallbacks()
    r = f(*[x.to(dev) if torch.is_tensor(x) else x for x in xs]).cpu()
    return r, dict(raccel.torch.fallbacks())


def compare(what, got, want, ulps, fallen, whole=False):
    """got against want: the same dtype and shape, equal (ulps 0) or within ulps of want's
    type relative to |want| (at least 1e-3) or, whole, the norm of their difference within
    ulps relative to want's norm, and nothing fell back."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return check(what, False, f"{got.dtype} {tuple(got.shape)} against {want.dtype} {tuple(want.shape)}")
    if whole:
        off = float((got.float() - want.float()).norm() / want.float().norm()) / torch.finfo(want.dtype).eps
        return check(what, off <= ulps and not fallen, f"{off:.2f} ulps over the whole tensor" + (f", fell back: {fallen}" if fallen else ""))
    if ulps == 0 or not want.is_floating_point():
        bad = int((got != want).sum()) if not want.is_floating_point() else int((~((got == want) | (got.isnan() & want.isnan()))).sum())
    else:
        eps = torch.finfo(want.dtype).eps
        bad = int(((got.float() - want.float()).abs() > ulps * eps * want.float().abs().clamp(min=1e-3)).sum())
    check(what, bad == 0 and not fallen,
          f"{bad} elements differ" + (f" beyond {ulps} ulps" if ulps else "") + (f", fell back: {fallen}" if fallen else ""))


def ops(a, b, c, w, labels):
    """(name, function, inputs, ulps against the CPU in the same type: 0 is bit for bit)"""
    return [
        ("add", lambda x, y: x + y, (a, b), 0), ("add alpha 0.3", lambda x, y: torch.add(x, y, alpha=0.3), (a, b), 0),
        ("sub", lambda x, y: x - y, (a, b), 0), ("mul", lambda x, y: x * y, (a, b), 0), ("div", lambda x, y: x / y, (a, c), 0),
        ("times 0.1", lambda x: x * 0.1, (a,), 0), ("plus 0.1", lambda x: x + 0.1, (a,), 0), ("1 - x", lambda x: 1 - x, (a,), 0),
        ("in place mul_ 0.9", lambda x: x.clone().mul_(0.9), (a,), 0),
        ("exp", torch.exp, (a,), 2), ("tanh", torch.tanh, (a,), 2), ("sigmoid", torch.sigmoid, (a,), 2),
        ("relu", torch.relu, (a,), 0), ("abs", torch.abs, (a,), 0), ("neg", torch.neg, (a,), 0),
        ("sqrt", torch.sqrt, (c,), 2), ("rsqrt", torch.rsqrt, (c,), 2), ("log", torch.log, (c,), 2),
        ("gelu", F.gelu, (a,), 2), ("silu", F.silu, (a,), 2), ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), (a,), 0),
        ("addcmul", lambda x, y, z: torch.addcmul(x, y, z, value=0.5), (a, b, c), 2),
        ("addcdiv", lambda x, y, z: torch.addcdiv(x, y, z, value=0.5), (a, b, c), 2),
        ("lerp", lambda x, y: torch.lerp(x, y, 0.3), (a, b), 2), ("clamp", lambda x: x.clamp(-0.5, 0.5), (a,), 0),
        ("maximum", torch.maximum, (a, b), 0), ("pow 2", lambda x: x.pow(2), (a,), 0),
        ("sum", lambda x: x.sum(), (a,), 2), ("sum of rows", lambda x: x.sum(1), (a,), 2), ("mean of columns", lambda x: x.mean(0), (a,), 2),
        ("amax", lambda x: x.amax(1), (a,), 0), ("argmax", lambda x: x.argmax(1), (a,), 0),
        ("greater than", lambda x, y: x > y, (a, b), 0), ("equal to 0.1", lambda x: x == 0.1, (a,), 0),
        ("mm", lambda x, y: x @ y, (a, w), 2), ("linear", lambda x, y, z: F.linear(x, y.t(), z[0, :17]), (a, w, b), 2),
        ("bmm", lambda x, y: torch.bmm(x.view(4, 16, 33), y.expand(4, 33, 17)), (a, w), 2),
        ("softmax", lambda x: x.softmax(1), (a,), 2), ("log_softmax", lambda x: x.log_softmax(1), (a,), 2),
        ("cross_entropy", lambda x, t: F.cross_entropy(x, t), (a, labels), 2),
        ("var", lambda x: x.var(1), (a,), 2), ("norm", lambda x: x.norm(), (a,), 2),
        ("max_pool2d", lambda x: F.max_pool2d(x.view(2, 2, 16, 33), 2), (a,), 0),
        ("conv2d", lambda x, y: F.conv2d(x.view(2, 2, 16, 33), y.reshape(-1)[:72].reshape(4, 2, 3, 3)), (a, w), 2),
    ] + selections(a, b, c) + [(name, f, xs, ulps) for name, f, xs, ulps in windowed_and_losses(a, b)] + [
        (f"{name} backward", grad_of(f), xs, ulps + 2) for name, f, xs, ulps in windowed_and_losses(a, b)
    ]


def selections(a, b, c):
    """Sorts, picks and scans, and the adds at indices."""
    g = torch.Generator().manual_seed(11)
    rows, places = torch.randperm(64, generator=g)[:8], torch.randint(0, 33, (64, 33), generator=g)
    return [
        ("sort (stable) values", lambda x: x.sort(dim=1, stable=True).values, (a,), 0),
        ("sort (stable) positions", lambda x: x.sort(dim=1, stable=True).indices, (a,), 0),
        ("topk values", lambda x: x.topk(5, 1).values, (a,), 0), ("kthvalue", lambda x: x.kthvalue(3, 1).values, (a,), 0),
        ("median", lambda x: x.median(), (a,), 0), ("max along a dim", lambda x: x.max(1).values, (a,), 0),
        ("max's positions along a dim", lambda x: x.max(1).indices, (a,), 0), ("cumsum", lambda x: x.cumsum(1), (a,), 2),
        ("remainder", lambda x, y: x % y, (a, c), 2),
        ("index_add", lambda x, y, i: x.index_add(0, i, y[:8], alpha=0.5), (a, b, rows), 2),
        ("scatter_add", lambda x, y, i: x.scatter_add(1, i, y), (a, b, places), 2),
    ]


def images(x):
    return x.view(2, 2, 16, 33)


def windowed_and_losses(a, b):
    """Pooling, resampling and the pointwise losses, whose backwards are checked too."""
    return [
        ("avg_pool2d", lambda x: F.avg_pool2d(images(x), 2), (a,), 2),
        ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(images(x), (5, 7)), (a,), 2),
        ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(images(x), (5, 7)), (a,), 0),
        ("interpolate nearest", lambda x: F.interpolate(images(x), scale_factor=2.0), (a,), 0),
        ("interpolate bilinear", lambda x: F.interpolate(images(x), size=(20, 40), mode="bilinear"), (a,), 2),
        ("mse_loss", F.mse_loss, (a, b), 2), ("l1_loss", F.l1_loss, (a, b), 2),
        ("smooth_l1_loss", F.smooth_l1_loss, (a, b), 2), ("huber_loss", lambda x, y: F.huber_loss(x, y, delta=0.5), (a, b), 2),
        ("binary_cross_entropy", lambda x, y: F.binary_cross_entropy(x.sigmoid(), y.sigmoid()), (a, b), 4),
        ("kl_div", lambda x, y: F.kl_div(x.log_softmax(1), y.softmax(1), reduction="batchmean"), (a, b), 4),
        ("glu", lambda x: F.glu(x[:, :32]), (a,), 2), ("prelu", lambda x, y: F.prelu(images(x), y[0, :2].abs()), (a, b), 0),
        ("group_norm", lambda x: F.group_norm(images(x), 1), (a,), 2), ("logsigmoid", F.logsigmoid, (a,), 2),
        # (PyTorch's CPU refuses these three in bf16; CUDA computes them, as the card does)
        ("prod", lambda x: (x * 0.1 + 1).prod(1), (a,), 4), ("cdist", lambda x, y: torch.cdist(x[:8], y[:5]), (a, b), 2),
        ("embedding_bag", lambda x, y: F.embedding_bag(torch.tensor([1, 3, 5, 7, 9, 2], device=x.device), x,
                                                       torch.tensor([0, 2], device=x.device), mode="mean"), (a, b), 2),
    ]


def grad_of(f):
    """The gradient of f's first input, for an output gradient of -0.5, 0.5 or 1.5 by the
    sign of f's output (exact in every type, so the CPU's and the card's are the same)."""
    def gradient(x, *rest):
        x = x.detach().requires_grad_()
        out = f(x, *rest)
        return torch.autograd.grad(out, x, grad_outputs=out.detach().sign() + 0.5)[0]
    return gradient


# Ops whose bf16 PyTorch's CPU computes in steps, rounding to bf16 between them (the
# backwards that add overlapping windows' gradients into a bf16 tensor one at a time,
# bilinear's weights): the card rounds once, so these compare with f32 rounded once.
ROUNDED_IN_STEPS_ON_THE_CPU = {"interpolate bilinear", "interpolate bilinear backward", "adaptive_avg_pool2d backward",
                               "adaptive_max_pool2d backward", "index_add", "scatter_add", "group_norm", "group_norm backward",
                               "glu backward"}
# GroupNorm keeps its statistics in the input's type (PyTorch's own composition rounds its
# mean and 1/deviation to bf16), and cdist's backward divides by its saved output, in the
# input's type too, so their backwards' cancelling terms carry that rounding: compared
# over the whole gradient, |got - want| / |want| within ulps of the type.
WHOLE_TENSOR = {"group_norm backward", "cdist backward"}


def rounded_once(f, xs, type):
    want = f(*[x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in xs])
    return want.to(type) if want.is_floating_point() else want


def reference(name, f, xs, type):
    """PyTorch's CPU result in the type, or the f32 result rounded once where its CPU lacks
    the op in that type or rounds in steps."""
    if name in ROUNDED_IN_STEPS_ON_THE_CPU:
        return rounded_once(f, xs, type)
    try:
        return f(*xs)
    except RuntimeError:
        return rounded_once(f, xs, type)


def ops_check(dev):
    g = torch.Generator().manual_seed(3)
    base = [torch.randn(64, 33, generator=g), torch.randn(64, 33, generator=g), torch.rand(64, 33, generator=g) + 0.5,
            torch.randn(33, 17, generator=g)]
    labels = torch.randint(0, 33, (64,), generator=g)
    a, b, c, w = [t.bfloat16() for t in base]
    for name, f, xs, ulps in ops(a, b, c, w, labels):
        got, fallen = on_card(dev, f, xs)
        compare(f"bf16 {name}", got, reference(name, f, xs, torch.bfloat16), ulps, fallen, name in WHOLE_TENSOR)
    # LayerNorm: PyTorch's CPU rounds some of its steps to bf16; the card rounds once.
    got, fallen = on_card(dev, lambda x: F.layer_norm(x, (33,)), (a,))
    compare("bf16 layer_norm (against f32 rounded once)", got, F.layer_norm(a.float(), (33,)).bfloat16(), 1, fallen)
    # f16: PyTorch 1.13's CPU has few f16 ops; the f32 result rounded once is the reference.
    h = [t.half() for t in base]
    for name, f, xs, ulps in ops(*h, labels):
        got, fallen = on_card(dev, f, xs)
        want = rounded_once(f, xs, torch.float16)
        if name in ("times 0.1", "plus 0.1", "in place mul_ 0.9", "equal to 0.1", "add alpha 0.3"):  # (numbers in f16)
            continue
        compare(f"f16 {name}", got, want, max(ulps, 1) if want.is_floating_point() else 0, fallen, name in WHOLE_TENSOR)
    # Mixed with f32: the f32 result, exactly (bf16 widens to f32 without loss).
    got, fallen = on_card(dev, lambda x, y: x * y + 1, (a, base[1]))
    compare("bf16 times f32", got, a * base[1] + 1, 0, fallen)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.layer(self.embed(x)).mean(1))


def train(dev, make, x, y, steps):
    torch.manual_seed(0)
    net = make().to(torch.bfloat16).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    xd, yd = x.to(dev), y.to(dev)
    raccel.torch.reset_fallbacks()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(xd), yd)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    types = {p.dtype for p in net.parameters()}
    return losses, dict(raccel.torch.fallbacks()), types


def training_check(dev):
    g = torch.Generator().manual_seed(5)
    models = [
        ("MLP", lambda: nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4)),
         torch.randn(64, 16, generator=g).bfloat16()),
        ("CNN", lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten(), nn.Linear(8, 4)),
         torch.randn(16, 3, 8, 8, generator=g).bfloat16()),
        ("transformer block", Block, torch.randint(0, 50, (16, 6), generator=g)),
    ]
    for name, make, x in models:
        y = torch.randint(0, 4, (x.shape[0],), generator=g)
        cpu, _, _ = train("cpu", make, x, y, 12)
        card, fallen, types = train(dev, make, x, y, 12)
        worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, card))
        check(f"bf16 {name} trains with the CPU's bf16 losses", worst <= 2e-2 and not fallen and types == {torch.bfloat16},
              f"{cpu[0]:.4f} -> {cpu[-1]:.4f} on the CPU, {card[0]:.4f} -> {card[-1]:.4f} on the card, worst relative "
              f"difference {worst:.2e}, parameters {sorted(str(t) for t in types)}" + (f", fell back: {fallen}" if fallen else ""))


def random_check(dev):
    """Draws into bf16 and f16 tensors: made in f32 on the card and rounded once, in their
    type, with the expected moments, reproducible from torch.manual_seed, nothing on the
    host."""
    n = 200_000
    for type in (torch.bfloat16, torch.float16):
        t = str(type).split(".")[1]
        raccel.torch.reset_fallbacks()
        torch.manual_seed(7)
        z = torch.empty(n, dtype=type, device=dev).normal_()
        torch.manual_seed(7)
        again = torch.empty(n, dtype=type, device=dev).normal_().cpu()
        u = torch.empty(n, dtype=type, device=dev).uniform_(2, 3).cpu()
        kept = F.dropout(torch.ones(n, dtype=type, device=dev), 0.3).cpu()
        coins = torch.bernoulli(torch.full((n,), 0.25, dtype=type, device=dev)).cpu()
        fallen = dict(raccel.torch.fallbacks())
        z = z.cpu()
        check(f"{t} normal_ has mean 0 and deviation 1", z.dtype == type and abs(z.float().mean()) < 0.01 and
              abs(z.float().std() - 1) < 0.01, f"mean {z.float().mean():.4f}, deviation {z.float().std():.4f}")
        check(f"{t} normal_ is reproducible from torch.manual_seed", torch.equal(z, again))
        check(f"{t} uniform_(2, 3) lies in [2, 3] with mean 2.5", u.dtype == type and bool((u >= 2).all() and (u <= 3).all()) and
              abs(u.float().mean() - 2.5) < 0.01, f"from {u.min()} to {u.max()}, mean {u.float().mean():.4f}")
        scales = kept[kept != 0].float().unique()
        check(f"{t} dropout keeps 70% scaled by 1/0.7", scales.numel() == 1 and abs(float(scales[0]) - 1 / 0.7) < 1e-2 and
              abs(float((kept == 0).float().mean()) - 0.3) < 0.01,
              f"{float((kept == 0).float().mean()):.4f} dropped, the others {scales.tolist()}")
        check(f"{t} bernoulli of 0.25", coins.dtype == type and bool(((coins == 0) | (coins == 1)).all()) and
              abs(float(coins.float().mean()) - 0.25) < 0.01, f"mean {float(coins.float().mean()):.4f}")
        check(f"{t} draws fell back to nothing", not fallen, str(fallen))


def main():
    dev = raccel.torch.device()
    ops_check(dev)
    random_check(dev)
    training_check(dev)
    print("PASS" if not failures else f"FAIL: {len(failures)} checks: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
