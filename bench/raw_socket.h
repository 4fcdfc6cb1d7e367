// raccel-bench's baselines built from plain sockets, with nothing of raccel in them:
// the two-hop relay that is the floor of a synchronous round trip (a unix socket into a
// relay process, TCP on to an echo process), and one loopback TCP socket's bulk rate.
#pragma once

#include <cstddef>
#include <string>

namespace raccel::bench {

bool readAll(int fd, void* buf, size_t n);
bool writeAll(int fd, const void* buf, size_t n);
// A loopback TCP listener (port 0: any; *port gets the bound one), or -1.
int tcpListen(int* port);
// Connected descriptors (TCP_NODELAY on TCP), retried for about 2 s; -1 when it failed.
int tcpConnect(int port);
int unixConnect(const std::string& path);

// The baseline's processes (raccel-bench --raw-echo / --raw-relay): hop 2 echoes every
// byte back on its TCP connection, hop 1 relays between a unix-socket client and hop 2.
int rawEcho(int port);
int rawRelay(const std::string& path, int port);

// The floor of a synchronous round trip through two hops: 96 bytes out and back through
// a relay process to an echo process (raccel-bench --raw-relay and --raw-echo, started
// here with their sockets and logs in `dir`), after 100 trips of warm-up: the median in
// microseconds of `iterations` trips, or -1 when the processes did not start. Each reply
// is waited for as raccel's client waits for its own (transport/spin_wait.h).
double rawTwoHopRttUs(const std::string& dir, int iterations);

// `bytes` through one loopback TCP socket, a sender and a receiver thread, 1 MiB at a
// time: Gbit/s.
double rawSocketGbps(size_t bytes);

// One byte back and forth between two threads over a pair of pipes, each thread pinned
// to a CPU (the same one, or two), median microseconds: the cost of the wake-ups every
// hop of a round trip pays, with nothing else in it. -1 when the CPUs cannot be had
// (one CPU, or an affinity that forbids them).
double wakeupRttUs(bool sameCpu, int iterations);

}  // namespace raccel::bench
