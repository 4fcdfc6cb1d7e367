@0x897387405d8db752;
# The operator API: raccelctl <-> scheduler, on the scheduler's console unix socket.
# One ConsoleRequest frame, one ConsoleReply frame back (same sequence number).

$import "/capnp/c++.capnp".namespace("raccel::wire");
using Guest = import "guest.capnp";
using Frame = import "frame.capnp";

struct ConsoleRequest {
  union {
    nodes @0 :Void;
    cards @1 :Void;
    pool @2 :Void;
    vaccels @3 :Void;
    vms @4 :Void;
    events @5 :Void;   # subscribe: the recent events, `done`, then every new one, each its own reply
    # Operator actions; each answers `done` (what happened) or `error`.
    preempt @6 :UInt64;       # suspend vaccel #id now; it waits for `resume`
    resume @7 :UInt64;        # let a suspended vaccel resume when blocks allow
    defrag @8 :Defrag;        # compact now
    drain @9 :Drain;
    setPolicy @10 :SetPolicy;
    # In a pool shared through etcd: the same for another host's vaccel (HOST/ID in
    # raccelctl vaccels), asked of the scheduler that serves it.
    preemptElsewhere @11 :VaccelRef;
    resumeElsewhere @12 :VaccelRef;
  }
}

struct VaccelRef {
  host @0 :Text;   # the scheduler that serves it
  id @1 :UInt64;   # its id there
}

struct Defrag {
  maxMoves @0 :UInt32;        # 0 = the scheduler's defrag_moves_per_minute budget
  maxMoveBytes @1 :UInt64;    # 0 = the scheduler's defrag_max_move_bytes
}

struct Drain {
  node @0 :Text;
  undo @1 :Bool;              # place on it again
}

# Changes a VM's policy; settings as in a config [vm] section (tflops, priority, kinds,
# memory_quota), the others keep their values.
struct SetPolicy {
  vm @0 :Text;
  settings @1 :List(Setting);
  struct Setting {
    key @0 :Text;
    value @1 :Text;
  }
}

struct ConsoleReply {
  union {
    error @0 :Frame.Error;
    nodes @1 :List(NodeEntry);
    cards @2 :List(CardEntry);
    pool @3 :PoolMap;
    vaccels @4 :List(VaccelEntry);
    vms @5 :List(VmEntry);
    event @6 :Event;
    done @7 :Text;
  }
}

# Something that happened in the scheduler, for `raccelctl events`.
struct Event {
  unixMs @0 :UInt64;
  kind @1 :Text;      # admitted | queued | refused | released | preempted | resumed |
                      # migrated | node-joined | node-lost | node-draining | node-drained |
                      # vm-attached | vm-detached | vm-rejected | policy |
                      # restored | recovered | reattached (after a scheduler restart)
  subject @2 :Text;   # "vm/program#id", a node or a VM name
  detail @3 :Text;
}

struct NodeEntry {
  name @0 :Text;
  address @1 :Text;
  online @2 :Bool;
  cards @3 :UInt32;
  firstBlock @4 :UInt32;
  blocks @5 :UInt32;
  msSinceHeartbeat @6 :UInt64;
  contexts @7 :UInt32;
  # Its host resources (CPU in thousandths of a core, memory in MiB; 0 = not counted)
  # and what vaccels placed there hold of them.
  hostCpuMilli @8 :UInt64;
  hostMemoryMib @9 :UInt64;
  hostCpuMilliUsed @10 :UInt64;
  hostMemoryMibUsed @11 :UInt64;
  state @12 :Text;       # online | draining (online, nothing new placed) | offline
}

struct CardEntry {
  node @0 :Text;
  index @1 :UInt32;
  kind @2 :Guest.CardKind;
  model @3 :Text;
  tflops @4 :Float64;
  memoryBytes @5 :UInt64;
  backend @6 :Text;
  firstBlock @7 :UInt32;
  blocks @8 :UInt32;
  online @9 :Bool;
}

struct PoolRange {
  first @0 :UInt32;
  count @1 :UInt32;
  state @2 :State;
  owner @3 :Text;        # "vm/program#id" for used ranges
  node @4 :Text;
  kind @5 :Guest.CardKind;
  enum State {
    free @0;
    used @1;
    offline @2;
    draining @3;         # free, but its netaccel is draining: nothing new is placed there
  }
}

struct PoolMap {
  blockTflops @0 :Float64;
  total @1 :UInt32;
  free @2 :UInt32;
  ranges @3 :List(PoolRange);
  # Every block of the map by state: blocks = free + used + draining + offline. `total`
  # counts the blocks that take work now (free, or used on a node that is not draining).
  blocks @4 :UInt32;
  used @5 :UInt32;
  draining @6 :UInt32;
  offline @7 :UInt32;
}

struct VaccelEntry {
  id @0 :UInt64;
  vm @1 :Text;
  program @2 :Text;
  priority @3 :Int32;
  blocks @4 :List(Guest.BlockRange);
  cards @5 :List(Guest.CardRef);
  memoryUsed @6 :UInt64;
  memoryQuota @7 :UInt64;
  instructions @8 :UInt64;
  state @9 :Text;        # running | waiting (for blocks) | suspending | suspended | moving |
                         # resuming | recovering (after a restart) | unavailable
  bytesMoved @10 :UInt64;  # copied between its cards by the scheduler (split ops, routed programs)
  kernelMs @11 :Float64;   # time its cards spent running its instructions (as of their last heartbeats)
  host @12 :Text;          # in a pool shared through etcd, the scheduler that serves it when
                           #   that is another: state "elsewhere" (it holds blocks: only id, vm,
                           #   program, priority and blocks are known here), or "waiting" or
                           #   "suspended" (it holds none: id, vm, program, priority and why);
                           #   empty for this scheduler's own
  why @13 :Text;           # why it waits or is off its cards (its preemption, what it waits for)
}

# A VM the scheduler serves or served, with its policy and where that came from.
struct VmEntry {
  name @0 :Text;
  source @1 :Text;       # "--vm", "FILE:LINE", "libvirt URI"
  socket @2 :Text;
  attach @3 :Text;       # listen | connect
  tflops @4 :Float64;
  priority @5 :Int32;
  kinds @6 :Text;        # "gpu,cpu"
  memoryQuota @7 :UInt64;
  state @8 :Text;        # connected | listening | waiting | stopped | rejected
  problem @9 :Text;      # why rejected, or the last failed attach
  blocksHeld @10 :UInt32;
  memoryUsed @11 :UInt64;
  kernelMs @12 :UInt64;   # kernel time of all its programs so far (tenant usage; survives restarts)
  hostCpuMilli @13 :UInt64;   # what each of its vaccels needs of its node's host (0: not counted)
  hostMemoryMib @14 :UInt64;
  host @15 :Text;         # in a pool shared through etcd, the scheduler that serves it when
                          #   that is another (state "elsewhere": its name and policy only)
}
