#!/usr/bin/python3
"""raccel.torch.assess() on the three reference models (tests/torch/*_train.py), beside
the analytic count of their matmul and convolution FLOPs for one training step (forward,
and backward: the gradients of every weight, and of every input that needs one). Each
must agree within 10%. Then a model that needs more than the whole pool is refused at
once, naming both figures, and the device opens and trains after it; the assessed
FLOPs are printed beside a measured step time on the card (not asserted: a benchmark).
Exits 1 on any failure.
"""
import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cnn_train  # noqa: E402
import mlp_train  # noqa: E402
import raccel.torch  # noqa: E402
import transformer_train  # noqa: E402


def mlp_case():
    b, f, h, c = 64, 20, 64, 4
    net = mlp_train.model(0, f, h, c)
    # forward 2b(fh + hc); backward: both weights' gradients, and the hidden layer's
    # input gradient (the data needs none).
    return "mlp", net, torch.randn(b, f), 2 * b * (f * h + h * c) * 2 + 2 * b * h * c


def cnn_case():
    args = SimpleNamespace(seed=0, channels=3, width=8, dropout=0.0)
    b, s, w = 32, 12, 8
    net = cnn_train.model(args)
    conv1 = 2 * b * w * s * s * (3 * 9)
    conv2 = 2 * b * (2 * w) * (s // 2) ** 2 * (w * 9)
    head = 2 * b * (2 * w) * 4
    # conv1: its weight's gradient only (the images need none); conv2 and the head: both.
    return "cnn", net, torch.randn(b, 3, s, s), 2 * conv1 + 3 * conv2 + 3 * head


def transformer_case():
    b, t, d, heads, h, c, vocab = 32, 8, 32, 2, 64, 4, 16
    net = transformer_train.Classifier(vocab, t, d, heads, h, c, 0.0)
    linears = 2 * b * t * (d * 3 * d + d * d + d * h + h * d)
    attention = 2 * 2 * b * heads * t * t * (d // heads)
    head = 2 * b * d * c
    return "transformer", net, torch.randint(0, vocab, (b, t)), 3 * (linears + attention + head)


def main():
    failures = []
    for name, net, example, analytic in (mlp_case(), cnn_case(), transformer_case()):
        a = raccel.torch.assess(net, example, steps_per_second=100, optimizer="adamw")
        ratio = a.matmul_flops / analytic
        print(f"{name}: assessed matmul+conv {a.matmul_flops / 1e6:.3f} MFLOP per step, analytic {analytic / 1e6:.3f} "
              f"(ratio {ratio:.3f}); {a}")
        if abs(ratio - 1) > 0.10:
            failures.append(f"{name}: assessed {a.matmul_flops} vs analytic {analytic}")
        if not a.elementwise_flops > 0 or not a.optimizer_flops > 0:
            failures.append(f"{name}: no elementwise or optimizer work counted: {a}")

    # More than the whole pool: refused at once, with the model's need and the pool's size.
    name, net, example, _ = mlp_case()
    start = time.monotonic()
    try:
        raccel.torch.device(model=net, example_input=example, steps_per_second=1e9)
        failures.append("a model needing more than the pool was admitted")
    except RuntimeError as e:
        print(f"refused after {time.monotonic() - start:.2f} s: {e}")
        for words in ("the model needs", "TFLOPS", "the pool has"):
            if words not in str(e):
                failures.append(f"the refusal does not say '{words}': {e}")
    # The same model at a rate the pool can serve opens the device, and trains.
    dev = raccel.torch.device(model=net, example_input=example, steps_per_second=10)
    net, x, y = net.to(dev), example.to(dev), torch.randint(0, 4, (example.shape[0],)).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    times = []
    for step in range(8):
        begin = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        raccel.torch.synchronize()
        times.append(time.perf_counter() - begin)
    median = sorted(times[3:])[len(times[3:]) // 2]
    a = raccel.torch.assess(net, example, steps_per_second=1.0 / median, optimizer="adamw")
    print(f"measured on the card: {median * 1e3:.2f} ms per step, so {a.flops_per_step / median / 1e9:.3f} GFLOPS "
          f"achieved for {a.flops_per_step / 1e6:.3f} MFLOP per step; vaccel: {raccel.torch.session().vaccel['description']}"
          )
    if failures:
        print("\n".join(failures))
        print("FAIL")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
