#!/usr/bin/python3
"""Ops that raccel.torch does not run on the card run on PyTorch's CPU, counted: each must
give the CPU's own result in the CPU's own type, and an in-place one applied to a view (a column, a slice, a
transpose) must change the viewed elements of the tensor on the card, as on the CPU.
Prints one line per case and PASS or FAIL; exits 1 on any failure."""
import sys

import torch

import raccel.torch

CASES = [
    ("igammac_ of a column", lambda x: x[:, 2].abs_().add_(0.5).igammac_(torch.full((4,), 2.0, device=x.device))),
    ("igamma_ of a row", lambda x: x[1].abs_().add_(0.5).igamma_(torch.full((5,), 1.5, device=x.device))),
    ("nextafter_ of a narrowed view", lambda x: x.narrow(1, 1, 3).nextafter_(torch.zeros(4, 3, device=x.device))),
    ("igammac_ of a transpose", lambda x: x.t().abs_().add_(0.5).igammac_(torch.full((5, 4), 1.5, device=x.device))),
    ("index_fill_ of an f64 slice", lambda x: x[1:3].double().index_fill_(1, torch.tensor([0, 2], device=x.device), 5.0).float()),
    ("i0_ of a slice with a step", lambda x: x[::2, 1:].i0_()),
    ("round_ with decimals of a transpose", lambda x: x.t().round_(decimals=1)),
    ("special.i1 into a narrowed view", lambda x: torch.special.i1(x[:, 1:3], out=x[:, 3:5])),
    ("index_copy_", lambda x: x.index_copy_(0, torch.tensor([2, 0], device=x.device), torch.ones(2, 5, device=x.device))),
    ("x[a, :, c] of an int16 view", lambda x: (x * 100).short().reshape(4, 5, 1)[torch.tensor([0, 3], device=x.device), :,
                                                                                 torch.tensor([0, 0], device=x.device)].float()),
    ("x[idx] = values into a transposed f64 copy",
     lambda x: x.t().double().index_put_((torch.tensor([1, 3], device=x.device),),
                                         torch.full((2, 4), 2.0, dtype=torch.float64, device=x.device)).float()),
    ("mode of a transpose", lambda x: x.t().round().mode(1).values),
    # f64 arithmetic runs on the host; its results stay f64 (these once came back f32).
    ("mse_loss of f64 copies", lambda x: torch.nn.functional.mse_loss(x.double(), x.flip(0).double())),
    ("smooth_l1_loss of f64 copies", lambda x: torch.nn.functional.smooth_l1_loss(x.double(), x.flip(1).double())),
    ("var of an f64 copy", lambda x: x.double().var(1)),
    ("logaddexp of f64 copies", lambda x: torch.logaddexp(x.double(), x.flip(0).double())),
    ("xlogy of f64 copies", lambda x: torch.xlogy(x.double().abs(), x.flip(0).double().abs())),
]


def main():
    dev = raccel.torch.device()
    torch.manual_seed(0)
    base = torch.randn(4, 5) * 3
    failed = 0
    for name, fn in CASES:
        want_x = base.clone()
        want = fn(want_x)
        raccel.torch.reset_fallbacks()
        got_x = base.to(dev)
        got = fn(got_x)
        counted = raccel.torch.fallbacks()
        ok = (torch.equal(got_x.cpu(), want_x) and got.dtype == want.dtype and
              torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-5) and bool(counted))
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {got.dtype} on the host {counted}", flush=True)
    print("PASS" if failed == 0 else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
