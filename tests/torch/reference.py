"""What the reference training scripts (tests/torch/cnn_train.py, transformer_train.py)
share: the device by name, the training loop over minibatches, and the comparison of the
CPU's losses with the card's."""
import time

import torch
import torch.nn.functional as F

try:  # before the first backward(): autograd sizes its device threads then
    import raccel.torch
except ImportError:
    raccel = None


def device_named(name, tflops, kinds=()):
    """The torch device for --device: raccel's card, the CPU, or (for the baseline on a
    machine with a GPU and a PyTorch built for CUDA) the GPU directly."""
    if name == "raccel":
        return raccel.torch.device(tflops=tflops, kinds=kinds)
    return torch.device(name)


def synchronizer(name):
    """Waits for the device's queued work (a step's time includes it)."""
    if name == "raccel":
        return raccel.torch.synchronize
    if name == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def fit(net, opt, x, y, args, device):
    """Trains args.steps minibatches of args.batch, cycling over args.samples, with
    cross-entropy; returns the losses (and prints every 20th with args.progress)."""
    if device == "raccel":
        raccel.torch.reset_fallbacks()
        _reads_at_fit[0] = raccel.torch.index_reads()
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


_reads_at_fit = [0]


def fallbacks(device):
    """What ran on the host since fit() began (op: calls), with the index checks that had
    to read an index back from the card: a wait that a training step on indices copied
    from the host, or made by the card, never needs."""
    return host_work(_reads_at_fit[0]) if device == "raccel" else {}


def host_work(reads_before):
    work = dict(raccel.torch.fallbacks())
    reads = raccel.torch.index_reads() - reads_before
    if reads:
        work["index bounds read back from the card"] = reads
    return work


def compare(cpu, dev, fallen_back, args, cpu_other=None):
    """Prints how the card's losses compare with the CPU's; True when every step agrees
    to args.rtol, all args.steps ran and nothing fell back. With cpu_other (the CPU's
    losses from a run that sums in another order, such as with more threads), a step
    agrees when it lies within args.rtol of the band the two CPU runs span: a network
    that amplifies rounding (BatchNorm over 100 steps) differs from itself that much."""
    other = cpu_other or cpu
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, dev))
    bad = [i for i, (a, o, b) in enumerate(zip(cpu, other, dev))
           if not min(a, o) - args.rtol * abs(a) <= b <= max(a, o) + args.rtol * abs(a)]
    print(f"steps {len(dev)} loss cpu {cpu[0]:.6f} -> {cpu[-1]:.6f}, raccel {dev[0]:.6f} -> {dev[-1]:.6f}, "
          f"worst relative difference {worst:.2e}")
    if cpu_other:
        self_worst = max(abs(a - o) / max(abs(a), 1e-12) for a, o in zip(cpu, other))
        print(f"the CPU against itself summing in another order: worst relative difference {self_worst:.2e}")
    print(f"fallbacks during training: {fallen_back if fallen_back else 'none'}")
    if bad:
        print(f"losses differ past {args.rtol} at {len(bad)} steps, first {bad[0]}: cpu {cpu[bad[0]]} raccel {dev[bad[0]]}")
    return not bad and not fallen_back and len(dev) == args.steps


def timed(device, make, args):
    """Median milliseconds of a training step on one batch over args.time steps, after 3
    warm-up steps; make(dev) gives (net, optimizer, x, y) on the device."""
    dev = device_named(device, args.tflops)
    net, opt, x, y = make(dev)
    sync = synchronizer(device)
    times = []
    for step in range(args.time + 3):
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        sync()
        if step >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def report_times(name, make, args):
    """Prints the CPU's and the card's median step (PyTorch's CPU with all its threads, as
    a user would run it) and their ratio, the bench's torch_step_ratio_<name>. With
    --device cuda the card is the GPU through PyTorch's own CUDA device (the baseline for
    raccel's CUDA card): cuda_step_ms."""
    card_name = "cuda" if args.device == "cuda" else "raccel"
    cpu = timed("cpu", make, args)
    card = timed(card_name, make, args)
    print(f"cpu_step_ms {cpu:.3f}\n{card_name}_step_ms {card:.3f}", flush=True)
    if card_name == "raccel":
        print(f"torch_step_ratio_{name} {card / cpu:.2f}", flush=True)
