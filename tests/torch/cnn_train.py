#!/usr/bin/python3
"""Trains a small CNN on synthetic images, unchanged PyTorch on the device asked for:
`raccel` (raccel.torch's privateuseone device) or `cpu`.

The model: two 3x3 convolutions (padding 1), each followed by BatchNorm2d and ReLU, a
2x2 max pool between them, global average pooling, dropout and a linear head; SGD with
Nesterov momentum and weight decay; cross-entropy. An image's label is the quadrant
where its bright blob sits. After training, the accuracy is measured in eval mode (the
batch norms' running statistics) under torch.no_grad().

  --compare   trains on both from the same seed (dropout off: the CPU's and the card's
              random streams differ) and checks that the losses agree to --rtol at every
              step, that the eval accuracy is the same and that no op fell back to the
              CPU; exits 1 otherwise.
"""
import argparse
import sys

import torch
import torch.nn as nn

from reference import compare, device_named, fallbacks, fit, report_times


def data(args):
    g = torch.Generator().manual_seed(args.seed)
    n, size = args.samples, args.size
    images = 0.3 * torch.randn(n, args.channels, size, size, generator=g)
    labels = torch.randint(0, 4, (n,), generator=g)
    half = size // 2
    for i in range(n):  # a bright 3x3 blob somewhere in the labelled quadrant
        y = int(torch.randint(0, half - 2, (1,), generator=g)) + (half if labels[i] >= 2 else 0)
        x = int(torch.randint(0, half - 2, (1,), generator=g)) + (half if labels[i] % 2 else 0)
        images[i, :, y:y + 3, x:x + 3] += 1.5
    return images, labels


def model(args):
    torch.manual_seed(args.seed)
    c = args.width
    return nn.Sequential(
        nn.Conv2d(args.channels, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(args.dropout), nn.Linear(2 * c, 4))


def train(device, args):
    """Returns (losses, eval accuracy, fallbacks)."""
    dev = device_named(device, args.tflops)
    images, labels = data(args)
    net = model(args).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    xd, yd = images.to(dev), labels.to(dev)
    losses = fit(net, opt, xd, yd, args, device)
    net.eval()
    with torch.no_grad():
        accuracy = (net(xd).argmax(1) == yd).float().mean().item()
    return losses, accuracy, fallbacks(device)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["raccel", "cpu", "cuda"], default="raccel")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=12, help="image height and width")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--width", type=int, default=8, help="the first convolution's channels")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--tflops", type=float, default=1.0)
    p.add_argument("--progress", action="store_true", help="print every 20th step's loss")
    p.add_argument("--time", type=int, default=0, metavar="N",
                   help="times N steps on one batch on the CPU and on the card (the bench)")
    args = p.parse_args()
    if args.size < 8 or args.size % 2:
        p.error("--size must be even and at least 8")
    if args.time:
        images, labels = data(args)

        def make(dev):
            net = model(args).to(dev)
            opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
            return net, opt, images[:args.batch].to(dev), labels[:args.batch].to(dev)
        report_times("cnn", make, args)
        return 0
    threads = torch.get_num_threads()  # (the default: one per core, as a CPU card's own torch uses)
    torch.set_num_threads(1)  # the CPU reference's sums in one order, run to run
    if not args.compare:
        losses, accuracy, fallen_back = train(args.device, args)
        print(f"final loss {losses[-1]:.6f} eval accuracy {accuracy:.4f} on {args.device}; fallbacks: {fallen_back or 'none'}")
        return 0
    if args.dropout:
        p.error("--compare needs --dropout 0 (the CPU's and the card's random streams differ)")
    cpu, cpu_acc, _ = train("cpu", args)
    torch.set_num_threads(max(2, threads))  # the CPU again, its sums split another way
    cpu_other, other_acc, _ = train("cpu", args)
    torch.set_num_threads(1)
    dev, dev_acc, fallen_back = train("raccel", args)
    ok = compare(cpu, dev, fallen_back, args, cpu_other)
    print(f"eval accuracy cpu {cpu_acc:.4f} (summed another way {other_acc:.4f}) raccel {dev_acc:.4f}")
    ok = ok and dev_acc in (cpu_acc, other_acc)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
