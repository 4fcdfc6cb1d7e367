// Durable state (docs/ARCHITECTURE.md, "State that survives a restart"): what a
// scheduler writes to its state database (state_dir; SQLite through Store) and how it
// comes back after a restart.
//
// The contract. The Persistence is the only reader and writer of the state database.
// It writes, each as one transaction: a netaccel's layout (its cards and first block,
// so a node that returns keeps its numbers), the operators' VM policy settings, a VM's
// tenant usage, and every placed or suspended vaccel (a suspended one with its saved
// buffers). At start (open) it reads them back into the scheduler: nodes offline at
// their numbers, settings and usage, suspended vaccels as they were, running ones
// `recovering` on exactly their old blocks (the rejoining is the scheduler's:
// scheduler/rejoin.cc). Every record is checked as it is read, as any file is; one that
// does not parse is logged and dropped, never fatal. Without a state directory every
// call does nothing. Loop thread only.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/error.h"
#include "schema/node.capnp.h"
#include "schema/state.capnp.h"
#include "scheduler/config.h"
#include "scheduler/scheduler.h"

namespace raccel::scheduler {

class Store;

class Persistence {
 public:
  Persistence(const SchedulerConfig& config, Scheduler& scheduler);
  ~Persistence();

  // Opens the database of state_dir and restores what it holds (nothing to do without one).
  Status open();
  bool enabled() const { return store_ != nullptr; }

  // A placed or suspended vaccel as it is now; `withSaved`: also its saved buffers (as a
  // suspended vaccel). Waiting or moving vaccels keep their last record.
  void vaccel(Scheduler::Session& s, bool withSaved = false);
  void forget(Scheduler::Session& s);  // it ended
  void node(size_t poolIndex, wire::Register::Reader reg);
  void dropNode(const std::string& name);  // forgotten (offline too long with nothing on it)
  void policy(const std::string& vm, const std::map<std::string, std::string>& settings);
  void usage(const Scheduler::Vm& vm);

 private:
  using Vm = Scheduler::Vm;
  using Session = Scheduler::Session;
  void restore();
  // restore's parts: the netaccels' block layout (how many), the VMs' policy overrides
  // and usage, the vaccels (counted as running or suspended), and one vaccel's record.
  size_t restoreNodes();
  void restorePolicies();
  void restoreVaccels(size_t& running, size_t& suspended);
  void readVaccel(const std::string& blob, std::unique_ptr<Session>& session);
  // vaccel's parts: the record's fields.
  void writeAsked(const Session& s, bool off, wire::VaccelRecord::Builder r);
  void writePlacement(const Session& s, wire::VaccelRecord::Builder r);
  void writeBuffers(const Session& s, wire::VaccelRecord::Builder r);
  void writeProgramsAndFailures(const Session& s, wire::VaccelRecord::Builder r);

  const SchedulerConfig& config_;
  Scheduler& s_;
  std::unique_ptr<Store> store_;
};

}  // namespace raccel::scheduler
