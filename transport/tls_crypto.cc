#include "transport/tls_crypto.h"

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstring>

#include "transport/tls.h"

namespace raccel::transport {

BIO_METHOD* linkBioMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "raccel link");
    BIO_meth_set_write_ex(m, [](BIO* b, const char* data, size_t n, size_t* written) -> int {
      auto& io = *static_cast<CipherIo*>(BIO_get_data(b));
      const size_t at = io.out.size();
      io.out.resize(at + n);  // (not zeroed: NoZeroAllocator)
      std::memcpy(io.out.data() + at, data, n);
      *written = n;
      return 1;
    });
    BIO_meth_set_read_ex(m, [](BIO* b, char* data, size_t n, size_t* read) -> int {
      auto& io = *static_cast<CipherIo*>(BIO_get_data(b));
      BIO_clear_retry_flags(b);
      *read = std::min(n, io.inLeft);
      if (*read == 0) {
        BIO_set_retry_read(b);
        return 0;
      }
      std::memcpy(data, io.in, *read);
      io.in += *read;
      io.inLeft -= *read;
      return 1;
    });
    BIO_meth_set_ctrl(m, [](BIO*, int cmd, long, void*) -> long { return cmd == BIO_CTRL_FLUSH ? 1 : 0; });
    BIO_meth_set_create(m, [](BIO* b) -> int {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

TlsCryptoThread::TlsCryptoThread(SSL* ssl, CipherIo* io, std::function<void()> wake)
    : ssl_(ssl), io_(io), wake_(std::move(wake)) {
  thread_ = std::thread([this] { run(); });
}

TlsCryptoThread::~TlsCryptoThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TlsCryptoThread::decrypt(Bytes cipher) {
  {
    std::lock_guard lock(mu_);
    inputBytes_ += cipher.size();
    input_.push_back(std::move(cipher));
  }
  cv_.notify_one();
}

void TlsCryptoThread::endOfInput() {
  {
    std::lock_guard lock(mu_);
    eof_ = true;
  }
  cv_.notify_one();
}

void TlsCryptoThread::seal(std::vector<PlainChunk> chunks) {
  {
    std::lock_guard lock(mu_);
    for (auto& c : chunks) toSeal_.push_back(std::move(c));
  }
  cv_.notify_one();
}

TlsCryptoThread::Output TlsCryptoThread::take() {
  std::lock_guard lock(mu_);
  Output out = std::move(output_);
  output_ = {};
  plainBytes_ = 0;
  return out;
}

bool TlsCryptoThread::claim() {
  std::lock_guard lock(mu_);
  const bool waiting = !output_.plain.empty() || !output_.sealed.empty() || output_.ended || !output_.failure.empty();
  if (busy_ || claimed_ || done_ || eof_ || !input_.empty() || !toSeal_.empty() || waiting) return false;
  claimed_ = true;
  return true;
}

void TlsCryptoThread::release() {
  bool work;
  {
    std::lock_guard lock(mu_);
    claimed_ = false;
    work = !input_.empty() || !toSeal_.empty() || eof_;
  }
  // Only for work handed over meanwhile: a wake-up for nothing costs the idle thread a
  // turn on a core, and a sync round trip made four of them.
  if (work) cv_.notify_one();
}

size_t TlsCryptoThread::pendingInputBytes() const {
  std::lock_guard lock(mu_);
  return inputBytes_ + plainBytes_;
}

Bytes TlsCryptoThread::buffer() {
  std::lock_guard lock(mu_);
  if (spare_.empty()) return Bytes(kReadBufferBytes);
  Bytes b = std::move(spare_.back());
  spare_.pop_back();
  b.resize(kReadBufferBytes);  // (not zeroed)
  return b;
}

void TlsCryptoThread::recycle(Bytes buffer) {
  if (buffer.capacity() < kReadBufferBytes) return;
  std::lock_guard lock(mu_);
  if (spare_.size() < 8) spare_.push_back(std::move(buffer));
}

void TlsCryptoThread::recycleCipher(Bytes buffer) {
  if (buffer.capacity() < kSealBurstBytes) return;
  buffer.clear();
  std::lock_guard lock(mu_);
  if (cipherSpare_.size() < 4) cipherSpare_.push_back(std::move(buffer));
}

size_t TlsCryptoThread::spareBytes() const {
  std::lock_guard lock(mu_);
  size_t bytes = 0;
  for (auto* list : {&spare_, &cipherSpare_})
    for (auto& b : *list) bytes += b.capacity();
  return bytes;
}

void TlsCryptoThread::releaseSpares() {
  std::vector<Bytes> spare, cipher;  // freed after the lock is let go
  std::lock_guard lock(mu_);
  spare.swap(spare_);
  cipher.swap(cipherSpare_);
}

// An empty buffer with room for a burst's records (a written one's, when there is one).
Bytes TlsCryptoThread::cipherBuffer() {
  std::lock_guard lock(mu_);
  if (cipherSpare_.empty()) {
    Bytes b;
    b.reserve(kSealBurstBytes + kSealBurstBytes / 16);  // (the records' headers and tags)
    return b;
  }
  Bytes b = std::move(cipherSpare_.back());
  cipherSpare_.pop_back();
  return b;
}

void TlsCryptoThread::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    // Once the link failed or the peer closed, nothing more is done with this SSL.
    busy_ = false;
    cv_.wait(lock, [&] { return stop_ || (!done_ && !claimed_ && (!input_.empty() || !toSeal_.empty() || eof_)); });
    if (stop_) return;
    busy_ = true;
    std::deque<Bytes> input = std::move(input_);
    input_.clear();
    std::vector<PlainChunk> toSeal = std::move(toSeal_);
    toSeal_.clear();
    const bool eof = eof_;
    lock.unlock();

    bool done = false;
    Output out;
    for (auto& cipher : input) {
      if (!done) decryptOne(cipher, out);
      done = done || out.ended || !out.failure.empty();
      const size_t n = cipher.size();
      recycle(std::move(cipher));
      lock.lock();
      inputBytes_ -= std::min(inputBytes_, n);
      lock.unlock();
      post(out);  // each read's frames as soon as they are plain
    }
    if (eof && !done) {  // every byte the peer sent before its EOF is plain now
      out.ended = true;
      done = true;
    }
    if (!done && !sealAll(toSeal)) done = true;
    post(out);
    lock.lock();
    done_ = done_ || done;
  }
}

void TlsCryptoThread::decryptOne(const Bytes& cipher, Output& out) {
  TlsErrorScope errors;
  io_->in = cipher.data();
  io_->inLeft = cipher.size();
  Bytes plain;
  size_t used = 0;
  for (;;) {
    if (used == plain.size()) {
      if (used) out.plain.push_back(std::move(plain));
      plain = buffer();
      used = 0;
    }
    size_t got = 0;
    int r = SSL_read_ex(ssl_, plain.data() + used, plain.size() - used, &got);
    if (r == 1) {
      used += got;
      continue;
    }
    int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) break;
    if (e == SSL_ERROR_ZERO_RETURN) out.ended = true;  // the peer's close_notify
    else out.failure = tlsErrors();
    if (out.failure.empty() && !out.ended) out.failure = "TLS read failed";
    break;
  }
  plain.resize(used);
  if (used) out.plain.push_back(std::move(plain));
  else recycle(std::move(plain));
  io_->in = nullptr;
  io_->inLeft = 0;
  // A post-handshake message may have made an answer (a key update's).
  if (!io_->out.empty()) out.sealed.push_back({std::move(io_->out), 0});
  io_->out.clear();
}

bool TlsCryptoThread::sealAll(std::vector<PlainChunk>& chunks) {
  TlsErrorScope errors;
  Output out;
  size_t sealed = 0;
  auto put = [&](const std::byte* data, size_t n) {
    while (n > 0) {
      size_t done = 0;
      if (SSL_write_ex(ssl_, data, n, &done) != 1) {
        out.failure = tlsErrors();
        if (out.failure.empty()) out.failure = "TLS write failed";
        return false;
      }
      data += done;
      n -= done;
    }
    return true;
  };
  auto handBack = [&] {
    if (!io_->out.empty() || sealed) out.sealed.push_back({std::move(io_->out), sealed});
    io_->out = cipherBuffer();
    sealed = 0;
    post(out);
  };
  if (io_->out.capacity() < kSealBurstBytes) io_->out = cipherBuffer();
  for (auto& c : chunks) {
    const bool ok = c.big ? put(c.header.data(), c.header.size()) && put(c.body.data(), c.body.size())
                          : put(c.bytes.data(), c.bytes.size());
    if (!ok) break;
    sealed += c.size();
    c = PlainChunk{};  // its memory goes now, not after the whole run
    if (sealed >= kSealBurstBytes) handBack();
  }
  const bool ok = out.failure.empty();
  handBack();
  return ok;
}

void TlsCryptoThread::post(Output& out) {
  if (out.plain.empty() && out.sealed.empty() && !out.ended && out.failure.empty()) return;
  {
    std::lock_guard lock(mu_);
    for (auto& p : out.plain) {
      plainBytes_ += p.size();
      output_.plain.push_back(std::move(p));
    }
    for (auto& s : out.sealed) output_.sealed.push_back(std::move(s));
    output_.ended = output_.ended || out.ended;
    if (output_.failure.empty()) output_.failure = std::move(out.failure);
  }
  out = Output{};
  wake_();
}

}  // namespace raccel::transport
