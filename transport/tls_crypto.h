// The cipher side of a TLS link (transport/connection.h's useTls): where OpenSSL reads
// ciphertext from and writes it to (CipherIo, through linkBioMethod()), and, once the
// handshake is done, a thread of the link's own that does its cipher work
// (TlsCryptoThread), so that the loop thread, which also relays and runs everything
// else of its daemon, only moves bytes.
//
// With a crypto thread, the loop thread hands it each read's ciphertext and the frames
// queued to send, and takes back, in order, the plaintext to frame and the ciphertext to
// write (woken through `wake`, a uv_async_send). The SSL object is the thread's from the
// hand-over on, but for small work the loop claims while the thread is idle (claim()).
// The thread holds at most what the loop hands it: the loop stops reading while kMaxInputBytes of the peer's wait here (ciphertext to decrypt, plaintext
// not yet framed), and its send backlog counts the frames handed over until their
// ciphertext is written.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transport/frame.h"

typedef struct bio_method_st BIO_METHOD;
typedef struct ssl_st SSL;

namespace raccel::transport {

// Bytes whose growth does not zero what is about to be overwritten (a read's buffer, a
// record's ciphertext): std::vector with default-initializing construction.
template <class T>
struct NoZeroAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = NoZeroAllocator<U>;
  };
  NoZeroAllocator() = default;
  template <class U>
  NoZeroAllocator(const NoZeroAllocator<U>&) noexcept {}
  template <class U, class... A>
  void construct(U* p, A&&... args) {
    if constexpr (sizeof...(A) == 0) ::new (static_cast<void*>(p)) U;
    else ::new (static_cast<void*>(p)) U(std::forward<A>(args)...);
  }
};
using Bytes = std::vector<std::byte, NoZeroAllocator<std::byte>>;

// What OpenSSL reads ciphertext from and writes it to: the current read's bytes in place,
// and a vector that goes out as it is. No memory-BIO copies, no zero-filled growth.
struct CipherIo {
  const std::byte* in = nullptr;  // the current read's bytes not yet taken
  size_t inLeft = 0;
  Bytes out;                      // ciphertext made since it was last taken
};

// A BIO over a CipherIo (BIO_get_data): reads take from `in` until it is used up
// ("retry": nothing more yet), writes append to `out`.
BIO_METHOD* linkBioMethod();

// One frame (or a run of small ones) to seal: `bytes`, or a big frame's header and body.
struct PlainChunk {
  std::vector<std::byte> bytes;
  std::array<std::byte, kHeaderBytes> header{};
  Body body;
  bool big = false;
  size_t size() const { return big ? kHeaderBytes + body.size() : bytes.size(); }
};

class TlsCryptoThread {
 public:
  // Ciphertext the loop may hold waiting for this thread before it stops reading.
  static constexpr size_t kMaxInputBytes = 4 << 20;
  // Ciphertext of at most about this much plaintext is handed back at a time, so that
  // writing one piece overlaps sealing the next.
  static constexpr size_t kSealBurstBytes = 1 << 20;
  static constexpr size_t kReadBufferBytes = 256 * 1024;

  struct Sealed {
    Bytes cipher;
    size_t plainBytes = 0;  // of the chunks handed over, sealed in it
  };
  struct Output {
    std::vector<Bytes> plain;  // decrypted, in order
    std::vector<Sealed> sealed;                 // to write, in order
    bool ended = false;   // the peer closed (close_notify, or EOF after all its data)
    std::string failure;  // TLS failed: the link must close
  };

  // Takes over `ssl` (its BIO over `io`) until destroyed; `wake` runs on this thread
  // whenever output waits.
  TlsCryptoThread(SSL* ssl, CipherIo* io, std::function<void()> wake);
  ~TlsCryptoThread();  // stops the thread (after its current step) and joins it
  TlsCryptoThread(const TlsCryptoThread&) = delete;
  TlsCryptoThread& operator=(const TlsCryptoThread&) = delete;

  // The loop thread's side.
  void decrypt(Bytes cipher);
  void endOfInput();  // the socket read EOF: `ended` follows the data before it
  void seal(std::vector<PlainChunk> chunks);
  Output take();
  // Small work is done on the loop thread itself, saving the two hand-overs of a round
  // trip: claim() lets it use the SSL (and io) until release(), when the thread is idle,
  // nothing is queued for it and nothing waits to be taken (so order is kept).
  static constexpr size_t kInlineBytes = 16 * 1024;
  bool claim();
  void release();
  // What it holds of the peer's: ciphertext to decrypt and plaintext not yet taken.
  size_t pendingInputBytes() const;
  // A buffer for the next read (kReadBufferBytes, recycled), and one given back unused
  // or once its plaintext is framed; a written ciphertext's buffer, to seal into again.
  Bytes buffer();
  void recycle(Bytes buffer);
  void recycleCipher(Bytes buffer);
  // The spares' bytes, and giving them back (an idle link: Connection::trimIdle).
  size_t spareBytes() const;
  void releaseSpares();

 private:
  void run();
  void decryptOne(const Bytes& cipher, Output& out);
  bool sealAll(std::vector<PlainChunk>& chunks);  // false: TLS failed (posted)
  void post(Output& out);
  Bytes cipherBuffer();

  SSL* ssl_;
  CipherIo* io_;
  std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::deque<Bytes> input_;
  size_t inputBytes_ = 0, plainBytes_ = 0;
  std::vector<PlainChunk> toSeal_;
  bool eof_ = false, stop_ = false, done_ = false;
  bool busy_ = false;     // the thread is working (with the SSL)
  bool claimed_ = false;  // the loop thread is (claim())
  Output output_;
  std::vector<Bytes> spare_, cipherSpare_;
  std::thread thread_;
};

}  // namespace raccel::transport
