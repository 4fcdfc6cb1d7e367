#!/usr/bin/python3
"""Trains a two-layer MLP classifier on synthetic data (plain SGD by default; --optimizer
adam/adamw with --weight-decay and --amsgrad, --activation tanh/gelu/silu/…, --layer-norm,
--clip-grad-norm), unchanged code on the device asked for: `raccel` (raccel.torch's
privateuseone device) or `cpu`. Each step also counts the batch's correct predictions
(argmax == target) on the device, as training scripts do; the final accuracy is measured
on the device in eval mode under torch.no_grad().

  --compare   trains on both from the same seed and checks, at every step, that the
              losses agree to --rtol, that the correct counts agree (at 99% of the steps
              or more: a near-tie may flip), that the final accuracy is the same, and that
              no op fell back to the CPU; exits 1 otherwise.
  --json      prints the losses, accuracy and fallbacks as JSON.
  --time N    times N steps after a warm-up (the bench), on each device asked for.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference import device_named, host_work, synchronizer

try:  # before the first backward(): autograd sizes its device threads then
    import raccel.torch
except ImportError:
    raccel = None


def data(seed, samples, features, classes):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    y = (x @ teacher + 0.1 * torch.randn(samples, classes, generator=g)).argmax(1)
    return x, y


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU,
               "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU, "leaky_relu": nn.LeakyReLU,
               "softplus": nn.Softplus, "hardtanh": nn.Hardtanh, "elu": nn.ELU}


def model(seed, features, hidden, classes, activation="relu", layer_norm=False):
    torch.manual_seed(seed)
    norm = [nn.LayerNorm(hidden)] if layer_norm else []
    return nn.Sequential(nn.Linear(features, hidden), *norm, ACTIVATIONS[activation](), nn.Linear(hidden, classes))


def optimizer(params, args):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
                               foreach=args.foreach)
    kind = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
    return kind(params, lr=args.lr, weight_decay=args.weight_decay, amsgrad=args.amsgrad, foreach=args.foreach)


def train(device, args, on_step=None):
    """Returns (losses, correct counts per step, final accuracy, fallbacks)."""
    dev = device_named(device, args.tflops)
    x, y = data(args.seed, args.samples, args.features, args.classes)
    net = model(args.seed, args.features, args.hidden, args.classes, args.activation, args.layer_norm).to(dev)
    opt = optimizer(net.parameters(), args)
    xd, yd = x.to(dev), y.to(dev)
    if device == "raccel":
        raccel.torch.reset_fallbacks()
    reads_before = raccel.torch.index_reads() if device == "raccel" else 0
    losses, correct = [], []
    for step in range(args.steps):
        lo = (step * args.batch) % args.samples
        xb, yb = xd[lo:lo + args.batch], yd[lo:lo + args.batch]
        opt.zero_grad()
        logits = net(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        if args.clip_grad_norm:
            nn.utils.clip_grad_norm_(net.parameters(), args.clip_grad_norm)
        opt.step()
        losses.append(loss.item())
        correct.append(int((logits.argmax(1) == yb).sum().item()))
        if on_step:
            on_step(step, losses[-1])
    net.eval()
    with torch.no_grad():
        accuracy = (net(xd).argmax(1) == yd).float().mean().item()
    fallbacks = host_work(reads_before) if device == "raccel" else {}
    return losses, correct, accuracy, fallbacks


def timed(device, args):
    """Milliseconds per training step (median of args.time steps after 3 warm-up steps)."""
    dev = device_named(device, args.tflops, args.kinds.split(",") if args.kinds else ())
    sync = synchronizer(device)
    x, y = data(args.seed, args.batch, args.features, args.classes)
    net = model(args.seed, args.features, args.hidden, args.classes, args.activation, args.layer_norm).to(dev)
    opt = optimizer(net.parameters(), args)
    xb, yb = x.to(dev), y.to(dev)
    times = []
    for step in range(args.time + 3):
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        sync()
        if step >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["raccel", "cpu", "cuda"], default="raccel")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--time", type=int, default=0, metavar="N")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help="default 0.1 for sgd, 0.01 for adam and adamw")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--amsgrad", action="store_true", help="adam and adamw: keep the largest second moment")
    p.add_argument("--momentum", type=float, default=0.0, help="sgd's momentum")
    p.add_argument("--foreach", action="store_true",
                   help="the optimizer's foreach path (one _foreach_ op over all the parameters at each step)")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu")
    p.add_argument("--layer-norm", action="store_true", help="a LayerNorm after the hidden layer")
    p.add_argument("--clip-grad-norm", type=float, default=0.0, metavar="MAX",
                   help="clip the gradients' total 2-norm to MAX before each step")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--tflops", type=float, default=1.0)
    p.add_argument("--kinds", default="", help="--time on raccel: the card kinds to ask for, comma-separated (gpu, cpu, ...)")
    p.add_argument("--progress", action="store_true", help="print every 20th step's loss")
    args = p.parse_args()
    if args.amsgrad and args.optimizer == "sgd":
        p.error("--amsgrad is for --optimizer adam or adamw")
    if args.lr is None:
        args.lr = 0.1 if args.optimizer == "sgd" else 0.01
    if args.time:  # PyTorch's CPU with all its threads, as a user would run it
        steps = {device: timed(device, args) for device in (["cpu", "raccel"] if args.compare else [args.device])}
        for device, ms in steps.items():
            print(f"{device}_step_ms {ms:.3f}", flush=True)
        if len(steps) == 2:
            print(f"torch_step_ratio_mlp {steps['raccel'] / steps['cpu']:.2f}", flush=True)
        return 0

    torch.set_num_threads(1)  # the CPU reference's sums in one order, run to run

    def progress(step, loss):
        if args.progress and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss:.6f}", flush=True)

    if not args.compare:
        losses, _, accuracy, fallbacks = train(args.device, args, progress)
        if args.json:
            print(json.dumps({"losses": losses, "accuracy": accuracy, "fallbacks": fallbacks}))
        print(f"final loss {losses[-1]:.6f} accuracy {accuracy:.4f} on {args.device}", flush=True)
        return 0

    cpu, cpu_correct, cpu_acc, _ = train("cpu", args)
    dev, dev_correct, dev_acc, fallbacks = train("raccel", args, progress)
    agree = sum(a == b for a, b in zip(cpu_correct, dev_correct))
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, dev))
    bad = [i for i, (a, b) in enumerate(zip(cpu, dev)) if abs(a - b) > args.rtol * abs(a)]
    print(f"steps {len(dev)} final loss cpu {cpu[-1]:.6f} raccel {dev[-1]:.6f} worst relative difference {worst:.2e}")
    print(f"accuracy cpu {cpu_acc:.4f} raccel {dev_acc:.4f}; "
          f"correct counts agree at {agree} of {len(dev_correct)} steps")
    print(f"fallbacks during training: {fallbacks if fallbacks else 'none'}")
    ok = not bad and cpu_acc == dev_acc and not fallbacks and len(dev) == args.steps and agree >= 0.99 * len(dev)
    if bad:
        print(f"losses differ past {args.rtol} at {len(bad)} steps, first {bad[0]}: cpu {cpu[bad[0]]} raccel {dev[bad[0]]}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
