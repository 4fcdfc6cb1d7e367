#!/usr/bin/python3
"""Trains a tiny transformer encoder classifier on synthetic token sequences, unchanged
PyTorch on the device asked for: `raccel` (raccel.torch's privateuseone device) or `cpu`.

The model: a token embedding plus a learned position embedding, one pre-norm encoder
block (multi-head self-attention written with bmm and softmax, LayerNorm, a GELU
feed-forward, dropout), a final LayerNorm, mean pooling and a linear head; AdamW with
weight decay; cross-entropy. The label of a sequence is the sum of its tokens modulo the
classes.

  --compare        trains on both from the same seed (dropout off: the CPU's and the
                   card's random streams differ) and checks that the losses agree to
                   --rtol at every step and that no op fell back to the CPU; exits 1
                   otherwise.
  --check-dropout  on the card: dropout keeps the expected fraction (within 1%), scales
                   what it keeps by 1/(1-p), and torch.manual_seed makes it repeat.
"""
import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference import compare, device_named, fallbacks, fit, raccel, report_times


class Block(nn.Module):
    def __init__(self, width, heads, hidden, dropout):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        batch, length, width = x.shape
        per = width // self.heads

        def split(t):  # [batch, length, width] -> [batch * heads, length, per]
            return t.reshape(batch, length, self.heads, per).transpose(1, 2).reshape(batch * self.heads, length, per)

        q, k, v = (split(t) for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        weights = self.drop(torch.softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(per), dim=-1))
        attended = torch.bmm(weights, v).reshape(batch, self.heads, length, per).transpose(1, 2).reshape(batch, length, width)
        x = x + self.drop(self.proj(attended))
        return x + self.drop(self.ff(self.norm2(x)))


class Classifier(nn.Module):
    def __init__(self, vocab, length, width, heads, hidden, classes, dropout):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(0.1 * torch.randn(length, width))
        self.block = Block(width, heads, hidden, dropout)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        x = self.block(self.embed(tokens) + self.position)
        return self.head(self.norm(x).mean(1))


def data(args):
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (args.samples, args.length), generator=g)
    return tokens, tokens.sum(1) % args.classes


def train(device, args):
    """Returns (losses, fallbacks during training)."""
    dev = device_named(device, args.tflops)
    tokens, labels = data(args)
    torch.manual_seed(args.seed)
    net = Classifier(args.vocab, args.length, args.width, args.heads, args.hidden, args.classes, args.dropout).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01)
    losses = fit(net, opt, tokens.to(dev), labels.to(dev), args, device)
    return losses, fallbacks(device)


def check_dropout(args):
    """Dropout on the card: the fraction kept, the scale, and the same mask from the same seed."""
    dev = raccel.torch.device(tflops=args.tflops)
    p, n = 0.3, 200000
    ones = torch.ones(n, device=dev)
    torch.manual_seed(7)
    first = F.dropout(ones, p, training=True)
    kept = (first != 0).float().mean().item()
    scale_ok = bool(((first == 0) | ((first - 1 / (1 - p)).abs() < 1e-6)).all().item())
    torch.manual_seed(7)
    again = F.dropout(ones, p, training=True)
    repeats = bool((again == first).all().item())
    other = F.dropout(ones, p, training=True)
    differs = bool((other != first).any().item())
    ok = abs(kept - (1 - p)) < 0.01 and scale_ok and repeats and differs
    print(f"dropout p={p}: kept {kept:.4f} (expected {1 - p:.4f}), kept values scaled by 1/(1-p): {scale_ok}, "
          f"same seed same mask: {repeats}, next draw differs: {differs}")
    print(f"fallbacks: {raccel.torch.fallbacks() or 'none'}")
    return ok and not raccel.torch.fallbacks()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["raccel", "cpu", "cuda"], default="raccel")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--check-dropout", action="store_true")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--length", type=int, default=8)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--tflops", type=float, default=1.0)
    p.add_argument("--progress", action="store_true", help="print every 20th step's loss")
    p.add_argument("--time", type=int, default=0, metavar="N",
                   help="times N steps on one batch on the CPU and on the card (the bench)")
    args = p.parse_args()
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    if args.time:
        tokens, labels = data(args)

        def make(dev):
            torch.manual_seed(args.seed)
            net = Classifier(args.vocab, args.length, args.width, args.heads, args.hidden, args.classes, args.dropout)
            net = net.to(dev)
            opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01)
            return net, opt, tokens[:args.batch].to(dev), labels[:args.batch].to(dev)
        report_times("transformer", make, args)
        return 0
    torch.set_num_threads(1)  # the CPU reference's sums in one order, run to run
    if args.check_dropout:
        ok = check_dropout(args)
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    if not args.compare:
        losses, fallen_back = train(args.device, args)
        print(f"final loss {losses[-1]:.6f} on {args.device}; fallbacks: {fallen_back or 'none'}")
        return 0
    if args.dropout:
        p.error("--compare needs --dropout 0 (the CPU's and the card's random streams differ)")
    cpu, _ = train("cpu", args)
    dev, fallen_back = train("raccel", args)
    ok = compare(cpu, dev, fallen_back, args)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
