@0xa0957bc009fe9843;
# Framing shared by every raccel link, and link-level control.
#
# Every frame on every link is a fixed 16-byte header followed by one Cap'n Proto
# message in the standard stream encoding (segment table + segments). The header is
# little-endian and readable without decoding the body, so relays (raccel-guestd, the
# scheduler) route frames by looking at it alone:
#
#   offset 0  u32 channel    multiplexed-link channel; 0 carries LinkControl
#   offset 4  u32 length     body bytes (a multiple of 8); > the negotiated maximum
#                            is a protocol error that closes that channel only
#   offset 8  u64 sequence   the sender's instruction sequence number; replies carry
#                            the sequence number of the instruction they answer.
#                            Guest programs number below 2^62; raccel-guestd's own
#                            fences use 2^62..2^63; the scheduler's own work 2^63 up
#
# Channels: on a VM link (virtio-serial port or its unix socket) each guest program is
# one channel, assigned by raccel-guestd. On a netaccel link each channel is one
# execution context (one guest session's slice of one card).

$import "/capnp/c++.capnp".namespace("raccel::wire");

const headerBytes :UInt32 = 16;
const protocolMajor :UInt16 = 1;
const protocolMinor :UInt16 = 0;
# Frames up to this size are always accepted; hello may lower it, never raise it.
const defaultMaxFrameBytes :UInt32 = 4194304;
# Large writes and reads travel in chunks of at most this many data bytes.
const chunkBytes :UInt32 = 1048576;

# The same codes, in the same order, as common/error.h's raccel::Code.
enum ErrorCode {
  ok @0;
  invalidArgument @1;
  notFound @2;
  resourceExhausted @3;    # quota, device memory, pool
  unavailable @4;          # retryable: node lost, scheduler absent, suspended too long
  unimplemented @5;        # kind not supported by any card of the vaccel
  permissionDenied @6;
  internal @7;
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
  # The OpenCL error an OpenCL card's driver gave (negative), 0 when none.
  openclError @2 :Int32;
}

# Frames on channel 0 of a multiplexed link.
struct LinkControl {
  union {
    # guestd -> scheduler: a guest program disconnected; end its session.
    # scheduler -> guestd: the session was ended (reason given); close the program.
    channelClosed @0 :ChannelClosed;
    ping @1 :Void;
    pong @2 :Void;
  }
}

struct ChannelClosed {
  channel @0 :UInt32;
  reason @1 :Error;
}
