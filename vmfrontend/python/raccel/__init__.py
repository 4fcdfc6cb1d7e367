"""raccel: drive a raccel virtual accelerator from Python.

    import raccel
    s = raccel.Session(tflops=2)            # through raccel-guestd, or $RACCEL_SOCKET
    x = s.alloc(4 * 1024)
    s.write(x, 0, bytes(4096))
    s.tensor("fill", [1024], [(x, 0, [1])], alpha=2.0)
    print(s.read(x, 0, 8))                  # waits; raises the first failure

`raccel.torch` puts PyTorch tensors on the same virtual accelerator.
"""
from ._raccel import Session

__all__ = ["Session"]
