// Experiment C, many schedulers on one shared pool (docs/ARCHITECTURE.md "Many hosts, one
// pool"): N schedulers place the openb trace's GPU pods on the openb cluster the way
// scheduler/etcd/shared_pool.h does, with a virtual clock and etcd's latencies as
// parameters. Each scheduler has its own view (its own real Pool), updated when the
// watch brings each commit; it places on that view and commits a transaction that
// compares the versions of the cards it read (and with host needs, of the node's host);
// a conflict brings it the whole pool as of the failed transaction and it places again.
// Pods arrive at each scheduler as a Poisson stream and leave after an exponential
// lifetime that keeps the cluster near `load`. Pure; one call is one run.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/cluster.h"
#include "sim/packing.h"

namespace raccel::sim {

struct OmegaOptions {
  uint32_t schedulers = 1;
  double ratePerScheduler = 20;  // pods per second arriving at each scheduler
  double commitMs = 2;           // etcd: proposal to commit (raft round and fsync)
  double rttMs = 0.5;            // scheduler <-> etcd round trip; the watch brings a commit after half of it
  double decisionMs = 0.2;       // a scheduler placing one pod on its view
  double etcdTxnPerS = 10000;    // etcd applies transactions one after another at this rate
  double load = 0.9;             // GPU capacity the pods' lifetimes aim to keep busy
  uint32_t pods = 20000;         // arrivals simulated
  uint32_t maxAttempts = 16;     // per pod, as SharedPoolOptions
  uint64_t seed = 42;
  Policy policy = Policy::raccel;
};

struct OmegaRun {
  uint64_t arrived = 0, admitted = 0, refused = 0, gaveUp = 0;
  uint64_t transactions = 0, conflicts = 0;
  uint64_t doubleHeld = 0;  // commits whose blocks etcd's state already gave away: must be 0
  double conflictRate = 0;  // conflicts / allocation transactions
  double latencyP50Ms = 0, latencyP99Ms = 0;  // arrival to commit seen, admitted pods
  double admittedPerS = 0;
  double etcdUtilization = 0;  // share of etcd's transaction capacity used
  double simulatedSeconds = 0;
};

// `pods`: the pod list to sample (its GPU pods only).
Result<OmegaRun> runOmega(const Cluster& cluster, const std::vector<Pod>& pods, const OmegaOptions& options);

}  // namespace raccel::sim
