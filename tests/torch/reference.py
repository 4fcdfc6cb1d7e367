"""What the reference training scripts (tests/torch/cnn_train.py, transformer_train.py)
share: the device by name, the training loop over minibatches, and the comparison of the
CPU's losses with the card's."""
import torch
import torch.nn.functional as F

try:  # before the first backward(): autograd sizes its device threads then
    import raccel.torch
except ImportError:
    raccel = None


def device_named(name, tflops):
    return raccel.torch.device(tflops=tflops) if name == "raccel" else torch.device("cpu")


def fit(net, opt, x, y, args, device):
    """Trains args.steps minibatches of args.batch, cycling over args.samples, with
    cross-entropy; returns the losses (and prints every 20th with args.progress)."""
    if device == "raccel":
        raccel.torch.reset_fallbacks()
    losses = []
    for step in range(args.steps):
        lo = (step * args.batch) % args.samples
        opt.zero_grad()
        loss = F.cross_entropy(net(x[lo:lo + args.batch]), y[lo:lo + args.batch])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if args.progress and (step % 20 == 0 or step == args.steps - 1):
            print(f"{device} step {step} loss {losses[-1]:.6f}", flush=True)
    return losses


def fallbacks(device):
    return raccel.torch.fallbacks() if device == "raccel" else {}


def compare(cpu, dev, fallen_back, args):
    """Prints how the card's losses compare with the CPU's; True when every step agrees
    to args.rtol, all args.steps ran and nothing fell back."""
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, dev))
    bad = [i for i, (a, b) in enumerate(zip(cpu, dev)) if abs(a - b) > args.rtol * abs(a)]
    print(f"steps {len(dev)} loss cpu {cpu[0]:.6f} -> {cpu[-1]:.6f}, raccel {dev[0]:.6f} -> {dev[-1]:.6f}, "
          f"worst relative difference {worst:.2e}")
    print(f"fallbacks during training: {fallen_back if fallen_back else 'none'}")
    if bad:
        print(f"losses differ past {args.rtol} at {len(bad)} steps, first {bad[0]}: cpu {cpu[bad[0]]} raccel {dev[bad[0]]}")
    return not bad and not fallen_back and len(dev) == args.steps
