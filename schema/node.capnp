@0x989ba7d3fbae863a;
# scheduler <-> netaccel, over TCP.
#
# Channel 0 carries these control messages. Channel c > 0 is execution context c: the
# scheduler forwards a guest session's Instructions (guest.capnp) verbatim on it and the
# netaccel answers with guest.capnp Replies on the same channel.

$import "/capnp/c++.capnp".namespace("raccel::wire");
using Guest = import "guest.capnp";
using Frame = import "frame.capnp";

struct CardInfo {
  index @0 :UInt32;
  kind @1 :Guest.CardKind;
  model @2 :Text;
  tflops @3 :Float64;
  memoryBytes @4 :UInt64;
  backend @5 :Text;
  programKinds @6 :List(Guest.ProgramKind);
  computeUnits @7 :UInt32;      # 0 = not known
  maxWorkGroupSize @8 :UInt32;
  localMemBytes @9 :UInt64;
  # An OpenCL card's extensions (space-separated, as its driver lists them) and its
  # CL_DEVICE_DOUBLE_FP_CONFIG (0: no double precision).
  openclExtensions @10 :Text;
  doubleFpConfig @11 :UInt64;
  images @12 :Guest.ImageLimits;  # checked by the scheduler (common/images.h checkLimits)
}

# netaccel -> scheduler
struct NodeMessage {
  union {
    register @0 :Register;
    heartbeat @1 :Heartbeat;
    # A tenant's sandbox on a card died or its device context faulted: the contexts it
    # served lost their buffers and programs (their instructions say so); a fresh sandbox
    # serves them from now on.
    fault @2 :CardFault;
  }
}

struct CardFault {
  card @0 :UInt32;
  contexts @1 :List(UInt32);
  message @2 :Text;
  cause @3 :FaultCause;
}

# Whether a lost sandbox was its tenant's work's doing (a faulting kernel, one that ran
# too long, a broken protocol) or not (killed from outside: an operator, the OOM killer);
# failover rebuilds the tenants of the latter elsewhere. Older netaccels say `unknown`.
enum FaultCause {
  unknown @0;
  itsWork @1;
  notItsOwn @2;
}

struct Register {
  versionMajor @0 :UInt16;
  versionMinor @1 :UInt16;
  name @2 :Text;          # unique per netaccel; a re-registering node keeps its blocks
  cards @3 :List(CardInfo);
  # Contexts it kept while the scheduler was away (docs/ARCHITECTURE.md, "State that
  # survives a restart"): the scheduler adopts those it knows (adoptContext) and closes
  # the others.
  contexts @4 :List(HeldContext);
  # The node's host resources that vaccels may need (Pool's HostVector): CPU in
  # thousandths of a core and memory in MiB; 0 = not counted.
  hostCpuMilli @5 :UInt64;
  hostMemoryMib @6 :UInt64;
}

struct HeldContext {
  context @0 :UInt32;
  card @1 :UInt32;
  lastSequence @2 :UInt64;          # the last guest instruction (sequence < 2^63) it received
  buffers @3 :List(HeldBuffer);     # after its queue ran dry
}

struct HeldBuffer {
  handle @0 :UInt64;
  bytes @1 :UInt64;
}

struct Heartbeat {
  contexts @0 :UInt32;
  queuedInstructions @1 :UInt64;
  usage @2 :List(ContextUsage);   # kernel time of every open context so far
}

struct ContextUsage {
  context @0 :UInt32;
  kernelNs @1 :UInt64;
}

# scheduler -> netaccel
struct SchedulerMessage {
  union {
    registered @0 :Registered;
    openContext @1 :OpenContext;
    closeContext @2 :UInt32;
    # The scheduler refused an instruction that would have created `handle` (e.g. an
    # alloc over the VM's quota); later uses fail with "dependency failed".
    poison @3 :Poison;
    # A context the netaccel kept (Register.contexts) is the scheduler's again: the
    # replies it made meanwhile follow, then it runs what arrives as before.
    adoptContext @4 :UInt32;
    # A same-host lane (transport/lane.h): after registering, a scheduler with a lane
    # socket offers it; a netaccel on the same host hands its two memfds there with the
    # token, and the scheduler says laneAccepted on this link once it has mapped them.
    # From then on big frames of both directions go through the memfds.
    laneOffer @5 :LaneOffer;
    laneAccepted @6 :Void;
  }
}

struct LaneOffer {
  path @0 :Text;    # the scheduler's lane socket (a unix socket on its host)
  token @1 :Data;   # one use, this link's only
}

struct Poison {
  context @0 :UInt32;
  handle @1 :UInt64;
  sequence @2 :UInt64;       # 0: no instruction failed (a buffer lost with a card's sandbox):
                             #   later uses fail with error's message as it is
  error @3 :Frame.Error;
}

struct Registered {
  accepted @0 :Bool;
  error @1 :Frame.Error;     # why not, when refused
  heartbeatMs @2 :UInt32;
  poolName @3 :Text;         # in a pool shared through etcd: its name there (its lease's
                             #   key schedulers/NAME); empty otherwise
  unusedCards @4 :List(UnusedCard);  # cards that got no block, and why (the netaccel logs it)
  struct UnusedCard {
    card @0 :UInt32;
    why @1 :Text;
  }
}

struct OpenContext {
  context @0 :UInt32;        # the channel its instructions arrive on
  card @1 :UInt32;
  memoryQuota @2 :UInt64;    # bytes; 0 = the card's memory
  label @3 :Text;            # "vm/program" for logs
  # Sharing the card: the context's blocks on it (its share), the tenant whose usage it
  # adds to (the VM), and its priority among that tenant's contexts.
  blocks @4 :UInt32;
  tenant @5 :Text;
  priority @6 :Int32;
}
