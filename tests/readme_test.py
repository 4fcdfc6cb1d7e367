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
import random
import re
import signal
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
    """A port free now (and, with pair, the next one too: etcd's peer port), below the
    kernel's ephemeral range (32768 and up), so no test's outgoing connection takes it
    between this check and the daemon's bind."""
    for _ in range(1000):
        port = random.randrange(10000, 32000)
        try:
            for p in ([port, port + 1] if pair else [port]):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    sys.exit("no free port below 32000")


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
        # mktemp puts the quick start's folder (its logs) here, to show when a block fails.
        env = dict(os.environ, TMPDIR=scratch, NODE_PORT=str(free_port()), HTTP_PORT=str(free_port()), ETCD_PORT=str(free_port(True)),
                   PORT_A=str(free_port()), PORT_B=str(free_port()))
        env.pop("RACCEL_SOCKET", None)
        # A Debian machine's commands (python3 is Debian's, with its numpy, PyOpenCL and torch).
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        # Its own process group: on a timeout the shell and every daemon it started go.
        shell = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=scratch, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        try:
            out, _ = shell.communicate(timeout=args.timeout)
            status = shell.returncode
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            out, _ = shell.communicate()
            status = "timed out after %d s" % args.timeout
        logs = ""
        if status != 0:
            for folder, _, files in os.walk(scratch):
                for f in sorted(files):
                    if f.endswith(".log"):
                        with open(os.path.join(folder, f), errors="replace") as log:
                            logs += "== %s (last 20 lines)\n%s\n" % (f, "".join(log.readlines()[-20:]))

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
        print(logs)
        for f in failures:
            print("FAIL: " + f)
        return 1
    print("PASS: %d shell block(s) of the README ran and printed what they say" % len(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
