// raccel-bench's bulk figures: bytes written to a card and read back through both hops
// (program -> scheduler -> netaccel): on one host as deployed (the same-host lane), and
// over the node link alone (as between two hosts) in mutual TLS and in plain TCP, beside
// one raw loopback TCP socket, all from the same run. `raccel-bench --only bulk` measures
// these alone; the full run measures them among the rest.
#pragma once

#include <cstddef>
#include <string>

namespace raccel::client {
class Session;
}

namespace raccel::bench {

struct BulkRun {
  double gbps = -1;  // both ways together, Gbit/s (-1: not measured)
  double writeSecs = 0, readSecs = 0;
  size_t bytes = 0;
  std::string problem;  // why it failed ("" when it did not)
  // The scheduler's and the netaccel's CPU time per GiB moved (written or read back),
  // over every round of a steadyBulk on a cluster of its own, each round's allocation
  // (the card zero-fills the new buffer) and free included (-1: not measured).
  double daemonCpuMsPerGib = -1;
  double writeGbps() const { return writeSecs > 0 ? bytes * 8 / writeSecs / 1e9 : -1; }
  double readGbps() const { return readSecs > 0 ? bytes * 8 / readSecs / 1e9 : -1; }
};

// The bytes each bulk run moves: 256 MiB, 32 MiB with --quick.
inline size_t bulkBytes(bool quick) { return quick ? size_t{32} << 20 : size_t{256} << 20; }

// `bytes` written into a new buffer of `session`, a fence, then read back and compared.
BulkRun writeAndReadBack(client::Session& session, size_t bytes);
// The steady rate: one run to warm the path (the daemons' pooled frame bodies, fresh
// pages), then the median of `rounds` runs (the first failure, if one failed).
BulkRun steadyBulk(client::Session& session, size_t bytes, int rounds = 3);

struct BulkFigures {
  size_t bytes = 0;
  double rawGbps = -1;
  // lane: one host as deployed (TLS link, big frames through the same-host lane);
  // plain and tls: the node link alone, as between two hosts.
  BulkRun lane, plain, tls;
  // The TLS link with each side's cipher work on a thread of the link's own
  // (tls_crypto_thread = on; as deployed it is auto: on with 4 cores or more).
  BulkRun tlsThread;
  bool tlsThreadDeployed = false;  // auto chose the thread here: `tls` ran with it too
  // An OpenCL card (PoCL here) with its tenant in a sandbox process, and the same card in
  // the netaccel's own process (--no-sandbox); not measured without an OpenCL device.
  BulkRun sandbox, inProcess;
  std::string problem;  // the first run that failed, or ""
  // Issue 31's targets: the lane and plain >= 0.8x the raw socket, TLS >= 0.8x plain, a
  // sandboxed card >= 0.9x the same card in process.
  bool plainMet() const { return plain.gbps >= 0.8 * rawGbps; }
  bool laneMet() const { return lane.gbps >= 0.8 * rawGbps; }
  bool tlsMet() const { return tls.gbps >= 0.8 * plain.gbps; }
  bool sandboxMet() const { return sandbox.gbps >= 0.9 * inProcess.gbps; }
};

// The TLS and plain runs on two clusters of their own, the raw socket, and the OpenCL
// card's sandboxed and in-process runs.
BulkFigures measureBulk(bool quick);
// The figures as JSON fields (no braces), and as raccel-bench's text lines.
std::string bulkJson(const BulkFigures& f);
void printBulkText(const BulkFigures& f);
}  // namespace raccel::bench
