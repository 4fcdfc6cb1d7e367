#!/usr/bin/python3
"""What users do around training, on the raccel device: a state_dict saved from the card
and loaded on the CPU (map_location) and back; .to() round trips of every dtype the
kernels take and of others; float64, float16 and bfloat16 converted, copied, joined,
picked and filled on the card bit for bit as on the CPU; torch.no_grad() and model.eval(); torch.manual_seed making
the card's random draws repeat; permutations, samples and exponential draws on the card; printing a device tensor; a tensor whose session has
closed refused with a clear error. Prints one line per check and PASS or FAIL; exits 1 on
any failure.
"""
import io
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


def main():
    dev = raccel.torch.device()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    x, y = torch.randn(16, 6).to(dev), torch.randint(0, 3, (16,)).to(dev)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    # state_dict from the card, saved and loaded on the CPU (map_location), and back.
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, map_location="cpu")
    on_cpu = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    on_cpu.load_state_dict(saved["model"])
    same = all(torch.equal(a.cpu(), b) for a, b in zip(net.state_dict().values(), on_cpu.state_dict().values()))
    check("a state_dict saved from the card loads on the CPU with the same values", same)
    net.eval()
    on_cpu.eval()
    with torch.no_grad():
        want = on_cpu(x.cpu())
        got = net(x).cpu()
    check("the model in eval mode under no_grad gives the CPU copy's outputs", torch.allclose(got, want, atol=1e-5),
          f"worst {float((got - want).abs().max()):.2e}")
    check("no_grad made no graph", not got.requires_grad)
    back = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).to(dev)
    back.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()))["model"])  # no map_location
    back.eval()
    with torch.no_grad():
        again = back(x).cpu()
    check("the checkpoint loaded without map_location into a model on the card gives the same outputs",
          torch.equal(again, got))
    mapped = torch.load(io.BytesIO(buffer.getvalue()), map_location=dev)["model"]
    check("map_location=the device loads every tensor (on the CPU under torch 1.13, with a warning)",
          all(torch.equal(mapped[k], v.cpu()) for k, v in net.state_dict().items()))
    opt2 = torch.optim.AdamW(back.parameters(), lr=0.01)
    opt2.load_state_dict(saved["optimizer"])
    check("an optimizer state saved from the card loads", len(opt2.state) == len(opt.state))

    # .to() round trips.
    for dtype in (torch.float32, torch.int64, torch.bool, torch.float64, torch.int32, torch.uint8):
        t = (torch.arange(-5, 7).reshape(3, 4) * 3).to(dtype)
        r = t.to(dev).to("cpu")
        check(f".to(device).to('cpu') of {dtype}", torch.equal(r, t) and r.dtype == dtype)
    big = torch.tensor([2 ** 40 + 1, -(2 ** 50) - 3])
    check("i64 past 2^24 keeps its value on the card (a copy and an add there)",
          torch.equal((big.to(dev) + 0).cpu(), big) and torch.equal(big.to(dev).clone().cpu(), big))
    t = torch.randn(4, 5)
    check("a transposed view copied to the card and back", torch.equal(t.t().to(dev).cpu(), t.t()))
    for dtype in (torch.bfloat16, torch.float16, torch.float64):  # kept in the transpose's layout (dense, not contiguous)
        on = t.to(dev).t().to(dtype)
        check(f"a transpose on the card converted to {dtype} and read back",
              on.stride() == (1, 5) and torch.equal(on.cpu(), t.t().to(dtype)) and
              torch.equal(t.t().to(dtype).to(dev).cpu(), t.t().to(dtype)))
    check(".float() and .long() on the card convert as the CPU does",
          torch.equal((t * 10).to(dev).long().cpu(), (t * 10).long()) and
          torch.equal((t > 0).to(dev).float().cpu(), (t > 0).float()))

    # float64, float16 and bfloat16 are kept on the card (storage types): their conversions,
    # strided reads and writes, contiguous copies, joins, picks (x[idx], index_select,
    # gather, where, masked_fill, flip, roll, triu, masked_select, take, diag) and fills
    # run there, bit for bit
    # as the CPU makes them (NaN, infinities, subnormals and ties included), not on the host.
    probe = torch.cat([torch.randn(64, dtype=torch.float64) * 1e3, torch.tensor(
        [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-310, 1e300, 65520.0, 2 ** -25, 1 + 2 ** -11,
         1 + 3 * 2 ** -11, 3.4028235677973366e38, 2.0 ** 62, -2.5], dtype=torch.float64)]).reshape(2, 39)

    def bits(t):
        t = t.contiguous()
        return t.view(torch.uint8) if t.dtype != torch.bool else t

    def same_bits(a, b):
        nan = a.isnan() if a.is_floating_point() else torch.zeros_like(a, dtype=torch.bool)
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(nan, b.isnan() if b.is_floating_point() else nan) \
            and torch.equal(bits(a.masked_fill(nan, 0)), bits(b.masked_fill(nan, 0)))
    kinds = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
    raccel.torch.reset_fallbacks()
    for src in kinds:
        on = (probe.clamp(-2.0 ** 31, 2.0 ** 31 - 1) if src == torch.int32 else probe).to(src)
        card = on.to(dev)
        converted = all(same_bits(card.to(dst).cpu(), on.to(dst)) for dst in kinds)
        strided = same_bits(card[:, 1::3].cpu(), on[:, 1::3]) and same_bits(card.t().contiguous().cpu(), on.t().contiguous())
        written = card.clone()
        written[:, 1::2] = on[:, 2::2].flip(1).to(dev)
        expect = on.clone()
        expect[:, 1::2] = on[:, 2::2].flip(1)
        joined = torch.cat([card, card[:, :5].to(torch.float32)], 1).cpu()
        cols, rows = torch.tensor([38, 0, 7, 7, 21]), torch.tensor([[1, 0, 1], [0, 0, 1]])
        mask = torch.arange(on.numel()).reshape(on.shape) % 3 == 0
        picked = same_bits(torch.where(mask.to(dev), card, card.flip(1)).cpu(), torch.where(mask, on, on.flip(1))) and \
            same_bits(card.masked_fill(mask.to(dev), 5).cpu(), on.masked_fill(mask, 5)) and \
            same_bits(card[:, cols.to(dev)].cpu(), on[:, cols]) and \
            same_bits(card.roll(3, 1).cpu(), on.roll(3, 1)) and same_bits(card.triu(2).cpu(), on.triu(2)) and \
            same_bits(card.masked_select(mask.to(dev)).cpu(), on.masked_select(mask)) and \
            same_bits(card.take(cols.to(dev)).cpu(), on.take(cols)) and \
            (src == torch.float16 or same_bits(card[0].diag(1).cpu(), on[0].diag(1))) and \
            same_bits(card.index_select(1, cols.to(dev)).cpu(), on.index_select(1, cols)) and \
            same_bits(card.gather(0, rows.to(dev)).cpu(), on.gather(0, rows))
        check(f"{src} on the card: converted to every type, read and written strided, joined, picked, as on the CPU",
              converted and strided and picked and same_bits(written.cpu(), expect) and
              same_bits(joined, torch.cat([on, on[:, :5].to(torch.float32)], 1)))
    for dtype, value in [(torch.float64, 0.1), (torch.float16, 1 / 3), (torch.bfloat16, -1e38), (torch.int64, 2 ** 40 + 1),
                         (torch.int32, -7), (torch.float64, float("nan"))]:
        check(f"torch.full of {value} as {dtype} on the card",
              same_bits(torch.full((2, 3), value, dtype=dtype, device=dev).cpu(), torch.full((2, 3), value, dtype=dtype)))
    held = dict(raccel.torch.fallbacks())
    check("none of those conversions, copies, joins, picks and fills ran on the host", not held, str(held))
    for dtype, value in [(torch.float16, 1e6), (torch.int32, 2 ** 40), (torch.bfloat16, 1e300)]:
        try:
            torch.full((2,), value, dtype=dtype, device=dev)
            check(f"a fill of {value} as {dtype} is refused as on the CPU", False)
        except RuntimeError as e:
            check(f"a fill of {value} as {dtype} is refused as on the CPU", "without overflow" in str(e), str(e))
    try:
        torch.zeros(3, dtype=torch.float16, device=dev).masked_fill_(torch.ones(3, dtype=torch.bool, device=dev), 1e6)
        check("masked_fill_ of 1e6 into float16 is refused as on the CPU", False)
    except RuntimeError as e:
        check("masked_fill_ of 1e6 into float16 is refused as on the CPU", "without overflow" in str(e), str(e))

    # Integer inputs take PyTorch's result types: true division and the float functions
    # give the default float type, an integer matmul stays integer.
    ints, other = torch.tensor([-7, 7, -1, 4]), torch.tensor([2, -3, 5, 4])
    for what, fn in [("a / b", lambda a, b: a / b), ("a / 2", lambda a, b: a / 2), ("sqrt", lambda a, b: a.abs().sqrt()),
                     ("exp", lambda a, b: a.exp()), ("log", lambda a, b: a.abs().log()), ("sigmoid", lambda a, b: a.sigmoid()),
                     ("tanh", lambda a, b: a.tanh()), ("rsqrt", lambda a, b: a.abs().rsqrt()),
                     ("pow 0.5", lambda a, b: a.abs().pow(0.5)), ("pow 2", lambda a, b: a.pow(2)),
                     ("mm", lambda a, b: a[None] @ b[:, None]), ("& 3, | 8 (bitwise)", lambda a, b: (a & 3) + (a | 8)),
                     ("i32 sum", lambda a, b: a.int().sum() + a.int().reshape(2, 2).sum(1))]:
        want, got = fn(ints, other), fn(ints.to(dev), other.to(dev)).cpu()
        check(f"i64 {what} gives {want.dtype} as on the CPU",
              got.dtype == want.dtype and torch.allclose(got.double(), want.double()), f"{got} against {want}")

    # torch.equal compares on the card (one bool read back).
    a = torch.arange(6.0).to(dev)
    raccel.torch.reset_fallbacks()
    check("torch.equal on the card: equal, unequal, other sizes, NaN, empty",
          torch.equal(a, a.clone()) and not torch.equal(a, a + 1) and not torch.equal(a, a[:5]) and
          not torch.equal(a.log().sub(a.log()), a.log().sub(a.log())) and torch.equal(a[:0], a[:0]) and
          not raccel.torch.fallbacks(), str(raccel.torch.fallbacks()))
    # PyTorch's legacy Tensor.new() (nn.init.orthogonal_ and optim.Rprop call it).
    on = torch.ones(2).to(dev)
    check("Tensor.new() of sizes, of nothing and of data on the card",
          on.new(3, 2).shape == (3, 2) and on.new().shape == (0,) and torch.equal(on.new([1.5, 2]).cpu(), torch.tensor([1.5, 2])))
    w = torch.nn.init.orthogonal_(torch.empty(4, 6).to(dev)).cpu()
    check("nn.init.orthogonal_ on the card gives orthonormal rows", torch.allclose(w @ w.t(), torch.eye(4), atol=1e-5))
    params = []
    for where in ("cpu", dev):
        torch.manual_seed(3)
        lin = nn.Linear(4, 2).to(where)
        rprop = torch.optim.Rprop(lin.parameters(), lr=0.01)
        for _ in range(3):
            rprop.zero_grad()
            lin(torch.ones(5, 4).to(where)).pow(2).sum().backward()
            rprop.step()
        params.append(lin.weight.detach().cpu())
    check("optim.Rprop steps as on the CPU", torch.allclose(params[0], params[1], atol=1e-6))

    # torch.manual_seed makes the card's draws repeat, wherever the tensors drawn into lie
    # (the first ones are still held when the second are drawn: elsewhere in memory).
    torch.manual_seed(123)
    first = torch.empty(1000, device=dev).normal_()
    first_mask = F.dropout(torch.ones(1000, device=dev), 0.5)
    torch.manual_seed(123)
    second = torch.empty(1000, device=dev).normal_()
    second_mask = F.dropout(torch.ones(1000, device=dev), 0.5)
    third = torch.empty(1000, device=dev).normal_()
    check("manual_seed repeats the card's random draws",
          torch.equal(first.cpu(), second.cpu()) and not torch.equal(second.cpu(), third.cpu()) and
          first.data_ptr() != second.data_ptr())
    check("manual_seed repeats dropout's mask on the card",
          torch.equal(first_mask.cpu(), second_mask.cpu()) and 400 < int((first_mask != 0).sum()) < 600)

    # Draws made of the card's uniform numbers: permutations, samples of a distribution,
    # exponential numbers. Each is checked for what it must be and against the frequencies
    # it should have (bounds of about five standard deviations, the seed fixed).
    raccel.torch.reset_fallbacks()
    torch.manual_seed(5)
    perms = [torch.randperm(n, device=dev) for n in (1, 10, 100000)]
    check("randperm on the card: a permutation of 0..n-1",
          all(torch.equal(p.sort().values.cpu(), torch.arange(p.numel())) for p in perms) and perms[2].dtype == torch.long)
    firsts = torch.stack([torch.randperm(4, device=dev) for _ in range(2000)]).cpu()
    where_zero = (firsts == 0).long().argmax(1).bincount(minlength=4)
    check("randperm puts each element in each place about as often", bool(((where_zero - 500).abs() < 110).all()),
          str(where_zero.tolist()))
    torch.manual_seed(11)
    again = torch.randperm(50, device=dev).cpu()
    torch.manual_seed(11)
    check("manual_seed repeats randperm", torch.equal(again, torch.randperm(50, device=dev).cpu()))
    weights = torch.tensor([0.1, 0.0, 0.6, 0.3]).to(dev)
    drawn = torch.multinomial(weights, 20000, replacement=True).cpu()
    share = drawn.bincount(minlength=4).double() / 20000
    check("multinomial with replacement: each category as often as its weight, never one of weight 0",
          bool(((share - torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.double)).abs() < 0.02).all()) and share[1] == 0,
          str(share.tolist()))
    rows = torch.tensor([[1.0, 2.0, 7.0]]).repeat(3000, 1).to(dev)
    first = torch.multinomial(rows, 1).cpu().flatten().bincount(minlength=3).double() / 3000
    check("multinomial of one sample per row: each category as often as its weight",
          bool(((first - torch.tensor([0.1, 0.2, 0.7], dtype=torch.double)).abs() < 0.04).all()), str(first.tolist()))
    without = torch.multinomial(torch.tensor([[5.0, 0.0, 1.0, 1.0, 3.0]] * 200).to(dev), 4).cpu()
    check("multinomial without replacement: distinct picks, the weight-0 category last",
          all(len(set(r.tolist())) == 4 for r in without) and bool((without[:, :3] != 1).all()))
    q = torch.empty(100000, device=dev).exponential_(2.0).cpu()
    check("exponential_ on the card: positive, of mean 1 / lambda",
          float(q.min()) > 0 and abs(float(q.mean()) - 0.5) < 0.01, f"mean {float(q.mean()):.4f}")
    ints = torch.randint(-3, 4, (70000,), device=dev).cpu()
    big = torch.randint(0, 1 << 36, (20000,), device=dev).cpu()
    counts = (ints + 3).bincount(minlength=7)
    check("randint on the card: every value in range about as often, and a range past 2^24",
          int(ints.min()) == -3 and int(ints.max()) == 3 and bool(((counts - 10000).abs() < 500).all()) and
          int(big.min()) >= 0 and int(big.max()) < (1 << 36) and abs(float(big.double().mean()) / (1 << 35) - 1) < 0.02,
          str(counts.tolist()))
    p = torch.tensor([0.0, 0.25, 0.9, 1.0]).repeat(10000, 1).to(dev)
    coins = torch.distributions.Bernoulli(probs=p).sample().cpu().mean(0)
    check("Bernoulli(p).sample() on the card: ones as often as p",
          bool(((coins - torch.tensor([0.0, 0.25, 0.9, 1.0])).abs() < 0.02).all()), str(coins.tolist()))
    mean, std = torch.tensor([-2.0, 0.0, 5.0]).to(dev), torch.tensor([0.5, 1.0, 3.0]).to(dev)
    z = torch.normal(mean.expand(40000, 3), std.expand(40000, 3)).cpu()
    check("normal(mean, std) of tensors on the card: their mean and deviation",
          torch.allclose(z.mean(0), mean.cpu(), atol=0.05) and torch.allclose(z.std(0), std.cpu(), rtol=0.03))
    c = torch.empty(40000, device=dev).cauchy_(1.0, 2.0).cpu()
    ln = torch.empty(40000, device=dev).log_normal_(0.5, 0.25).cpu()
    geo = torch.empty(40000, device=dev).geometric_(0.25).cpu()
    check("cauchy_, log_normal_ and geometric_ on the card: their median, mean and support",
          abs(float(c.median()) - 1.0) < 0.05 and abs(float(ln.log().mean()) - 0.5) < 0.01 and float(geo.min()) >= 1 and
          bool((geo == geo.round()).all()) and abs(float(geo.mean()) - 4.0) < 0.1,
          f"{float(c.median()):.3f} {float(ln.log().mean()):.3f} {float(geo.mean()):.3f}")
    shapes = torch.tensor([0.5, 2.0, 9.0]).to(dev)
    g = torch.distributions.Gamma(shapes.expand(40000, 3), torch.ones(3).to(dev)).sample().cpu()
    check("Gamma(k).sample() on the card (below 1 and above): positive, of mean and variance k",
          float(g.min()) > 0 and torch.allclose(g.mean(0), shapes.cpu(), rtol=0.03) and
          torch.allclose(g.var(0), shapes.cpu(), rtol=0.08), f"{g.mean(0).tolist()} {g.var(0).tolist()}")
    b = torch.distributions.Beta(torch.tensor([2.0]).to(dev), torch.tensor([5.0]).to(dev)).sample((40000,)).cpu()
    dirichlet = torch.distributions.Dirichlet(torch.tensor([1.0, 2.0, 3.0]).to(dev)).sample((20000,)).cpu()
    check("Beta and Dirichlet on the card: in (0, 1), rows summing to 1, their means",
          0 < float(b.min()) and float(b.max()) < 1 and abs(float(b.mean()) - 2 / 7) < 0.01 and
          torch.allclose(dirichlet.sum(1), torch.ones(20000), atol=1e-5) and
          torch.allclose(dirichlet.mean(0), torch.tensor([1 / 6, 2 / 6, 3 / 6]), atol=0.01))
    xs = torch.randn(20000)
    xd = xs.to(dev).requires_grad_()
    y = torch.nn.functional.rrelu(xd, 0.1, 0.3, training=True)
    y.sum().backward()
    neg = xs <= 0
    slopes = y.detach().cpu()[neg] / xs[neg]
    check("rrelu in training on the card: slopes in [lower, upper) of their mean, positives kept, the gradient the slope",
          bool(((slopes >= 0.1) & (slopes < 0.3)).all()) and abs(float(slopes.mean()) - 0.2) < 0.005 and
          torch.equal(y.detach().cpu()[~neg], xs[~neg]) and torch.allclose(xd.grad.cpu()[neg], slopes),
          f"{float(slopes.mean()):.4f}")
    check("no draw fell back to the CPU", not raccel.torch.fallbacks(), str(raccel.torch.fallbacks()))

    # Printing a device tensor.
    text = str(torch.tensor([[1.5, -2.0], [0.25, 3.0]]).to(dev))
    check("printing a device tensor shows its values and device",
          "1.5000" in text and "privateuseone" in text, text.replace("\n", " "))

    # A tensor whose session has closed is refused, with a clear error.
    raccel.torch.session().close()
    try:
        (x + 1).cpu()
        check("a tensor of a closed session is refused", False, "no error")
    except RuntimeError as e:
        check("a tensor of a closed session is refused", "closed" in str(e) or "no session" in str(e), str(e).splitlines()[0])

    print("PASS" if not failures else "FAIL: " + ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
