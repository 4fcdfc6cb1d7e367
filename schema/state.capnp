@0xef860a7df9f0deb6;
# What the scheduler keeps in its state database (scheduler/store.h) so that a restart
# loses no allocation: not a wire contract, but versioned the same way (new fields only).

$import "/capnp/c++.capnp".namespace("raccel::wire");
using Guest = import "guest.capnp";
using Node = import "node.capnp";
using Frame = import "frame.capnp";

# A netaccel as it registered: the pool keeps its block numbers across restarts.
struct NodeRecord {
  name @0 :Text;
  firstBlock @1 :UInt32;
  cards @2 :List(Node.CardInfo);
  hostCpuMilli @3 :UInt64;
  hostMemoryMib @4 :UInt64;
}

# A placed vaccel (running, or suspended with its buffers in the saved-buffer table).
struct VaccelRecord {
  id @0 :UInt64;
  vm @1 :Text;
  program @2 :Text;
  priority @3 :Int32;
  askedPriority @4 :Int32;
  want @5 :UInt32;              # blocks
  kinds @6 :UInt8;              # accepted kinds (bit i = CardKind i)
  noWait @7 :Bool;
  token @8 :UInt64;
  maxFrame @9 :UInt32;
  suspended @10 :Bool;
  operatorHold @11 :Bool;
  why @12 :Text;
  blocks @13 :List(Guest.BlockRange);   # empty while suspended
  members @14 :List(MemberRecord);
  programs @15 :List(Data);             # every LoadProgram Instruction it sent, as sent
  failed @16 :List(FailedHandle);
  # Suspended only: its buffers (their bytes are in the saved-buffer table) and the last
  # guest instruction included in them.
  buffers @17 :List(Node.HeldBuffer);
  appliedThrough @18 :UInt64;
  kernelNs @19 :UInt64;                 # kernel time of contexts it no longer has
  hostCpuMilli @20 :UInt64;             # the node host resources it holds (its VM's policy)
  hostMemoryMib @21 :UInt64;
  # Its service as the admission policy counts it (scheduler/admission.h), on the wall
  # clock in seconds, so its waiting time is kept across restarts.
  attainedBlockSeconds @22 :Float64;
  serviceClass @23 :UInt8;
  lastRunSeconds @24 :Float64;
  waitingSince @25 :Float64;
}

struct MemberRecord {
  node @0 :Text;
  card @1 :UInt32;      # the pool's card index
  context @2 :UInt32;
  blocks @3 :UInt32;
}

struct FailedHandle {
  handle @0 :UInt64;
  sequence @1 :UInt64;
  error @2 :Frame.Error;
}
