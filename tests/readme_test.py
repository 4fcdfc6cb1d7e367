#!/usr/bin/env python3
"""Runs every shell block of the README, in order, as a reader would, and checks what
each prints.

A block fenced as ```sh is run; blocks fenced otherwise (text, xml, yaml) are pictures
and configuration, not commands. The blocks run in one bash, one after the other, so
the quick start's daemons and variables serve the sections after it. A line
`# prints: TEXT` in a block says TEXT appears in that block's output (after what the
lines before it printed). The shell runs in a scratch folder where `build` is the build
under test and `scripts` the repository's, with NODE_PORT, HTTP_PORT, ETCD_PORT, PORT_A and PORT_B set
to free ports so runs beside other tests do not collide. The README's first lines (the
setup-and-run and test commands) are plain text: CI runs the test command itself, and
the test Demo.TheMainJobRunsAndSaysOk runs the demo after the test command's setup.

Exit status 0 when every block ran and printed what it says; 1 otherwise, naming the
block, its first line and what was missing, with the whole output.
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile

MARK = "@@readme-block-%d@@"


def blocks(readme):
    """The ```sh blocks: (heading, first line number, lines)."""
    found, heading, inside, start, lines = [], "", False, 0, []
    for number, line in enumerate(open(readme, encoding="utf-8").read().split("\n"), 1):
        if not inside and line.startswith("#"):
            heading = line.lstrip("# ").strip()
        if not inside and line.strip() == "```sh":
            inside, start, lines = True, number + 1, []
        elif inside and line.strip() == "```":
            found.append((heading, start, lines))
            inside = False
        elif inside:
            lines.append(line)
    if inside:
        sys.exit("README: the block at line %d never ends" % start)
    return found


def free_port(pair=False):
    """A port free now (and, with pair, the next one too: etcd's peer port)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pair or port >= 65535:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    sys.exit("no free port pair")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", required=True, help="the repository (its README.md and scripts/)")
    p.add_argument("--build", required=True, help="the build folder under test (its bin/, lib/, icd/, python/)")
    p.add_argument("--timeout", type=int, default=240, help="seconds for all the blocks together (default 240)")
    args = p.parse_args()

    found = blocks(os.path.join(args.source, "README.md"))
    if not found:
        sys.exit("README: no ```sh block")
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2> /dev/null || true; wait' EXIT"]
    for i, (_, _, lines) in enumerate(found):
        script.append("echo '%s'" % (MARK % i))
        script.extend(lines)
    script.append("echo '%s'" % (MARK % len(found)))

    with tempfile.TemporaryDirectory(prefix="raccel-readme-") as scratch:
        os.symlink(os.path.abspath(args.build), os.path.join(scratch, "build"))
        os.symlink(os.path.join(os.path.abspath(args.source), "scripts"), os.path.join(scratch, "scripts"))
        env = dict(os.environ, NODE_PORT=str(free_port()), HTTP_PORT=str(free_port()), ETCD_PORT=str(free_port(True)),
                   PORT_A=str(free_port()), PORT_B=str(free_port()))
        env.pop("RACCEL_SOCKET", None)
        # A Debian machine's commands (python3 is Debian's, with its numpy, PyOpenCL and torch).
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        try:
            run = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace", timeout=args.timeout)
            out, status = run.stdout, run.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            status = "timed out after %d s" % args.timeout

    failures = []
    for i, (heading, start, lines) in enumerate(found):
        begin, end = out.find(MARK % i), out.find(MARK % (i + 1))
        if begin < 0 or end < 0:
            failures.append("block at README line %d (%s) did not finish: %s" % (start, heading, lines[0]))
            break
        printed = out[begin + len(MARK % i):end]
        at = 0
        for line in lines:
            want = re.match(r"\s*# prints: (.*)$", line)
            if not want:
                continue
            where = printed.find(want.group(1), at)
            if where < 0:
                failures.append("block at README line %d (%s): missing %r" % (start, heading, want.group(1)))
                break
            at = where + len(want.group(1))
        print("README line %d (%s): %d line(s) ran" % (start, heading, len(lines)), flush=True)
    if status != 0:
        failures.append("the shell exited with %s" % status)
    if failures:
        print(out)
        for f in failures:
            print("FAIL: " + f)
        return 1
    print("PASS: %d shell block(s) of the README ran and printed what they say" % len(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
