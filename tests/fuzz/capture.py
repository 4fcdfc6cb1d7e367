#!/usr/bin/env python3
"""Captures the fuzz targets' seed corpus from a real run (python3 from Debian only).

Starts a real raccel-scheduler (plain TCP on loopback), puts a recording proxy in front
of each of its listeners (a VM socket, the node port, the console socket), runs a real
raccel-netaccel, raccel-guestd, raccel-run programs and raccelctl commands through the
proxies, and writes what each client sent, byte for byte, as seed files:

    tests/fuzz/corpus/guest/*    what raccel-guestd sent on the VM socket
    tests/fuzz/corpus/node/*     what raccel-netaccel sent on the node port
    tests/fuzz/corpus/console/*  what raccelctl sent on the console socket
    tests/fuzz/corpus/frames/*   the same streams, a read-size byte in front

usage: capture.py BUILD_BIN_DIR [CORPUS_DIR]
"""
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MAX_SEED = 16 * 1024


class Recorder(threading.Thread):
    """Accepts on `listen`, connects each client to `upstream`, relays both ways and
    keeps what each client sent (one bytes object per connection)."""

    def __init__(self, listen, upstream):
        super().__init__(daemon=True)
        self.listen, self.upstream, self.streams = listen, upstream, []
        family = socket.AF_UNIX if isinstance(listen, str) else socket.AF_INET
        self.server = socket.socket(family, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(listen)
        self.server.listen(64)

    def run(self):
        while True:
            client, _ = self.server.accept()
            threading.Thread(target=self.relay, args=(client,), daemon=True).start()

    def relay(self, client):
        family = socket.AF_UNIX if isinstance(self.upstream, str) else socket.AF_INET
        up = socket.socket(family, socket.SOCK_STREAM)
        up.connect(self.upstream)
        sent = bytearray()
        self.streams.append(sent)
        peers = {client: up, up: client}
        while True:
            ready, _, _ = select.select(list(peers), [], [])
            for s in ready:
                data = s.recv(1 << 16)
                if not data:
                    client.close()
                    up.close()
                    return
                if s is client:
                    sent.extend(data)
                peers[s].sendall(data)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(predicate, seconds=10):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    bindir = sys.argv[1]
    corpus = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    tmp = tempfile.mkdtemp(prefix="raccel-capture-")
    port, proxy_port = free_port(), free_port()
    procs = []

    def start(*args):
        log = open(os.path.join(tmp, os.path.basename(args[0]) + "-%d.log" % len(procs)), "w")
        procs.append(subprocess.Popen([os.path.join(bindir, args[0])] + list(args[1:]), stdout=log, stderr=log))

    try:
        start("raccel-scheduler", "--node-listen", "127.0.0.1:%d" % port, "--console", tmp + "/console-real.sock",
              "--insecure", "--http-listen", "off", "--vm", "name=vm1,socket=%s/vm-real.sock,tflops=8,memory_quota=64MiB" % tmp)
        assert wait_for(lambda: os.path.exists(tmp + "/console-real.sock")), "scheduler did not start"
        vm = Recorder(tmp + "/vm.sock", tmp + "/vm-real.sock")
        node = Recorder(("127.0.0.1", proxy_port), ("127.0.0.1", port))
        console = Recorder(tmp + "/console.sock", tmp + "/console-real.sock")
        for r in (vm, node, console):
            r.start()
        env_card = ["--discover", "none", "--card", "kind=gpu,tflops=4,memory=256MiB", "--insecure", "--http-listen", "off"]
        start("raccel-netaccel", "--name", "node0", "--scheduler", "127.0.0.1:%d" % proxy_port, *env_card)
        start("raccel-guestd", "--port", tmp + "/vm.sock", "--listen", tmp + "/guestd.sock")
        assert wait_for(lambda: os.path.exists(tmp + "/guestd.sock")), "guestd did not start"
        ctl = [os.path.join(bindir, "raccelctl"), "--socket", tmp + "/console.sock"]
        assert wait_for(lambda: b'"total":4' in subprocess.run(ctl + ["pool", "--json"], capture_output=True).stdout)
        run = [os.path.join(bindir, "raccel-run"), "--socket", tmp + "/guestd.sock"]
        for args in (["--size", "16", "--iterations", "1"], ["--size", "24", "--ops", "--iterations", "2"],
                     ["--rtt", "20"], ["--size", "8", "--tflops", "2", "--name", "two-blocks"]):
            subprocess.run(run + args, check=True, capture_output=True, timeout=60)
        for args in (["nodes"], ["cards"], ["pool"], ["vaccels"], ["vms"], ["events", "--recent"],
                     ["set-policy", "vm1", "tflops=6", "priority=1"], ["defrag"], ["preempt", "99"], ["resume", "99"],
                     ["drain", "node0"], ["drain", "node0", "--undo"]):
            subprocess.run(ctl + args, capture_output=True, timeout=30)
        time.sleep(1.5)  # heartbeats
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
    written = 0
    for name, recorder in (("guest", vm), ("node", node), ("console", console)):
        os.makedirs(os.path.join(corpus, name), exist_ok=True)
        os.makedirs(os.path.join(corpus, "frames"), exist_ok=True)
        seeds = []
        for stream in recorder.streams:
            # One seed per channel (a guest program's session; a netaccel context's
            # replies behind its registration), whole frames only, at most MAX_SEED bytes.
            frames, at = [], 0
            while at + 16 <= len(stream):
                channel, length = struct.unpack_from("<II", stream, at)
                frames.append((channel, bytes(stream[at:at + 16 + length])))
                at += 16 + length
            control = [f for c, f in frames if c == 0]
            for channel in sorted({c for c, _ in frames}):
                prefix = [] if channel == 0 or name != "node" else control[:1]
                seed = b""
                for f in prefix + [f for c, f in frames if c == channel]:
                    if len(seed) + len(f) > MAX_SEED:
                        break
                    seed += f
                if seed:
                    seeds.append(seed)
        for i, seed in enumerate(seeds):
            with open(os.path.join(corpus, name, "captured-%02d" % i), "wb") as f:
                f.write(seed)
            with open(os.path.join(corpus, "frames", "%s-%02d" % (name, i)), "wb") as f:
                f.write(bytes([0x2e]) + seed)
            written += 1
    print("capture.py: %d seeds written under %s" % (written, corpus))


if __name__ == "__main__":
    main()
