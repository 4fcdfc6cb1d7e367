#include "transport/connection.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "common/log.h"
#include "transport/tls_crypto.h"

namespace raccel::transport {

struct Connection::Sink : FrameReader::Sink {
  Connection& c;
  explicit Sink(Connection& connection) : c(connection) {}
  void onFrame(const FrameHeader& header, Body body) override {
    if (c.closing_) return;
    if (c.lanes_ && header.channel >= kFirstReservedChannel) return c.onLaneFrame(header, std::move(body));
    if (c.callbacks_.onFrame) c.callbacks_.onFrame(c, header, std::move(body));
  }
  void onOversized(const FrameHeader& header) override {
    if (!c.closing_ && c.callbacks_.onOversized) c.callbacks_.onOversized(c, header);
  }
};

std::shared_ptr<Connection> Connection::create(uv_loop_t* loop, Kind kind, uint32_t maxFrameBytes) {
  auto c = std::shared_ptr<Connection>(new Connection(loop, kind, maxFrameBytes));
  c->self_ = c;
  return c;
}

Connection::Connection(uv_loop_t* loop, Kind kind, uint32_t maxFrameBytes) : kind_(kind), reader_(maxFrameBytes) {
  if (kind == Kind::pipe) uv_pipe_init(loop, &handle_.pipe, 0);
  else uv_tcp_init(loop, &handle_.tcp);
  handle_.handle.data = this;
}

struct Connection::Tls {
  std::shared_ptr<TlsContext> context;
  SSL* ssl = nullptr;
  bool established = false;
  std::string peerName;
  CipherIo io;
  Bytes sending;  // ciphertext of the write in flight (swapped with io.out)
  // With a crypto thread (TlsContext::cryptoThread(), from the handshake on): the SSL is
  // its alone; `wake` is its uv_async_send; the read in progress goes into `reading`; the
  // ciphertext it made waits in `ready` (and `sent` while written).
  std::unique_ptr<TlsCryptoThread> crypto;
  uv_async_t wake;
  Bytes reading;
  std::vector<Bytes> ready, sent;
  size_t readyBytes = 0;
  bool inputFull = false;  // reading stopped while the thread has kMaxInputBytes to decrypt
  ~Tls() {
    crypto.reset();  // (joins it: nothing uses the SSL after)
    if (ssl) SSL_free(ssl);  // frees its BIO
  }
};

Connection::~Connection() = default;

void Connection::useTls(std::shared_ptr<TlsContext> context) {
  tls_ = std::make_unique<Tls>();
  tls_->context = std::move(context);
}

const std::string& Connection::peerName() const {
  static const std::string none;
  return tls_ && tls_->established ? tls_->peerName : none;
}

void Connection::receiveTls(const std::byte* data, size_t n) {
  Tls& t = *tls_;
  TlsErrorScope errors;
  if (!t.ssl) {
    // Made when the first bytes move (a client's hello, a server's first read), so a
    // peer that connects and says nothing costs no TLS memory.
    if (n == 0 && t.context->role() == TlsContext::Role::server) return;  // the client speaks first
    t.ssl = SSL_new(t.context->native());
    BIO* bio = BIO_new(linkBioMethod());
    BIO_set_data(bio, &t.io);
    SSL_set_bio(t.ssl, bio, bio);
    if (t.context->role() == TlsContext::Role::server) {
      SSL_set_accept_state(t.ssl);
    } else {
      SSL_set_connect_state(t.ssl);
      SSL_set1_host(t.ssl, kSchedulerName);  // the scheduler's certificate must name it
    }
  }
  // OpenSSL reads this read's bytes in place; each loop below runs until it wants more.
  // They are not kept past this call (an early return drops what is left: the link closes).
  t.io.in = data;
  t.io.inLeft = n;
  struct Forget {
    CipherIo& io;
    bool armed = true;  // (not once a crypto thread has the CipherIo)
    ~Forget() {
      if (armed) io.in = nullptr, io.inLeft = 0;
    }
  } forget{t.io};
  if (!t.established) {
    int r = SSL_do_handshake(t.ssl);
    if (r != 1) {
      int e = SSL_get_error(t.ssl, r);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        flush();
        return;
      }
      long verify = SSL_get_verify_result(t.ssl);
      std::string queued = tlsErrors();  // read (and so emptied) on every path
      std::string why = verify != X509_V_OK ? X509_verify_cert_error_string(verify) : queued;
      RLOG_WARN("transport") << "TLS handshake with " << peer_ << " failed: " << why;
      flush();  // the alert, if any
      close();
      return;
    }
    t.established = true;
    if (X509* cert = SSL_get0_peer_certificate(t.ssl)) {
      char cn[256] = "";
      int len = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
      if (len > 0) t.peerName.assign(cn, static_cast<size_t>(len));
    }
    RLOG_DEBUG("transport") << "TLS with " << peer_ << " (" << t.peerName << "): " << SSL_get_version(t.ssl) << " "
                            << SSL_get_cipher_name(t.ssl);
    if (t.context->cryptoThread()) {
      // What this read holds past the handshake is the thread's first input.
      Bytes rest(t.io.inLeft);
      if (t.io.inLeft) std::memcpy(rest.data(), t.io.in, t.io.inLeft);
      t.io.in = nullptr, t.io.inLeft = 0;
      forget.armed = false;
      startCryptoThread(std::move(rest));
      return;
    }
  }
  if (!readRecords()) return;
  flush();  // queued frames (now that it is established) and any post-handshake message
}

// The frames in the records of tls_->io.in, decrypted straight into the frame reader and
// delivered. False when the link is closed (by the peer, a TLS failure or a callback).
bool Connection::readRecords() {
  Tls& t = *tls_;
  Sink sink(*this);
  for (;;) {
    auto room = reader_.writable();
    size_t got = 0;
    int r = SSL_read_ex(t.ssl, room.data(), room.size(), &got);
    if (r == 1) {
      reader_.commit(got, sink);
      if (closing_) return false;
      continue;
    }
    int e = SSL_get_error(t.ssl, r);
    if (e == SSL_ERROR_WANT_READ) return true;
    if (e != SSL_ERROR_ZERO_RETURN) RLOG_WARN("transport") << "TLS from " << peer_ << " failed: " << tlsErrors();
    truncated_ = reader_.midFrame();
    close();
    return false;
  }
}

void Connection::startCryptoThread(Bytes rest) {
  Tls& t = *tls_;
  takeLoopCipher();  // the handshake's last flight goes first
  uv_async_init(handle_.handle.loop, &t.wake, [](uv_async_t* a) { static_cast<Connection*>(a->data)->onCryptoOutput(); });
  t.wake.data = this;
  uv_async_t* wake = &t.wake;
  t.crypto = std::make_unique<TlsCryptoThread>(t.ssl, &t.io, [wake] { uv_async_send(wake); });
  // Even with nothing left of this read: OpenSSL may have read ahead past the handshake
  // into its own buffer (the peer's first frames in the same segment as its Finished).
  t.crypto->decrypt(std::move(rest));
  flush();  // the flight, and the frames queued meanwhile (to be sealed)
}

// What the crypto thread made: plaintext framed and delivered, ciphertext written.
void Connection::onCryptoOutput() {
  Tls& t = *tls_;
  if (closing_ || !t.crypto) return;
  auto keep = shared_from_this();
  Cork cork;
  TlsCryptoThread::Output out = t.crypto->take();
  if (!out.failure.empty()) {
    RLOG_WARN("transport") << "TLS with " << peer_ << " failed: " << out.failure;
    truncated_ = reader_.midFrame();
    close();
    return;
  }
  for (auto& s : out.sealed) {
    queuedBytes_ -= std::min(queuedBytes_, s.plainBytes);
    queuedBytes_ += s.cipher.size();
    t.readyBytes += s.cipher.size();
    if (!s.cipher.empty()) t.ready.push_back(std::move(s.cipher));
  }
  if (!out.plain.empty()) {
    Sink sink(*this);
    for (auto& p : out.plain) {
      for (size_t at = 0; at < p.size() && !closing_;) {
        auto room = reader_.writable();
        const size_t n = std::min(room.size(), p.size() - at);
        std::memcpy(room.data(), p.data() + at, n);
        reader_.commit(n, sink);
        at += n;
      }
      t.crypto->recycle(std::move(p));
      if (closing_) return;
    }
    if (callbacks_.onBatchEnd) callbacks_.onBatchEnd(*this);
    if (closing_) return;
  }
  if (out.ended) {
    truncated_ = reader_.midFrame();
    close();
    return;
  }
  if (t.inputFull && t.crypto->pendingInputBytes() < TlsCryptoThread::kMaxInputBytes / 2) {
    t.inputFull = false;
    if (!paused_) resumeReading();
  }
  flush();
}

// Small work with the thread idle (claimed): a read's records decrypted straight into
// the frame reader, or the queued frames sealed, here, as without the thread.
void Connection::readInline(const std::byte* data, size_t n) {
  Tls& t = *tls_;
  {
    TlsErrorScope errors;
    t.io.in = data;
    t.io.inLeft = n;
    const bool open = readRecords();
    t.io.in = nullptr;
    t.io.inLeft = 0;
    if (open) takeLoopCipher();  // (a key update's answer)
  }
  if (t.crypto) t.crypto->release();  // (a callback may have closed the link: the thread is gone)
  if (closing_) return;
  if (callbacks_.onBatchEnd) callbacks_.onBatchEnd(*this);
  if (!closing_) flush();
}
void Connection::sealInline() {
  Tls& t = *tls_;
  {
    TlsErrorScope errors;
    if (sealQueued()) takeLoopCipher();
  }
  if (t.crypto) t.crypto->release();
}
// The records made on the loop thread (the handshake's last flight, small work done
// inline), ready to write as the crypto thread's are.
void Connection::takeLoopCipher() {
  Tls& t = *tls_;
  if (t.io.out.empty()) return;
  queuedBytes_ += t.io.out.size();
  t.readyBytes += t.io.out.size();
  t.ready.push_back(std::move(t.io.out));
  t.io.out = Bytes();
}
size_t Connection::queuedPlainBytes() const {
  size_t waiting = 0;
  for (auto& c : queue_)
    waiting += std::holds_alternative<BigChunk>(c) ? std::get<BigChunk>(c).body.size() : std::get<std::vector<std::byte>>(c).size();
  return waiting;
}

// With a crypto thread: the queued frames go to it to be sealed, and the ciphertext it
// made goes out, all of it in one write.
void Connection::flushCrypto() {
  Tls& t = *tls_;
  if (!queue_.empty() && queuedPlainBytes() <= TlsCryptoThread::kInlineBytes && t.crypto->claim()) {
    sealInline();
    if (closing_) return;
  }
  if (!queue_.empty()) {
    std::vector<PlainChunk> chunks;
    chunks.reserve(queue_.size());
    for (auto& c : queue_) {
      PlainChunk p;
      if (auto* small = std::get_if<std::vector<std::byte>>(&c)) {
        p.bytes = std::move(*small);
      } else {
        auto& big = std::get<BigChunk>(c);
        p.big = true;
        p.header = big.header;
        p.body = std::move(big.body);
      }
      chunks.push_back(std::move(p));
    }
    queue_.clear();
    t.crypto->seal(std::move(chunks));
  }
  if (writing_ || t.ready.empty()) return;
  t.sent = std::move(t.ready);
  t.ready.clear();
  std::vector<uv_buf_t> bufs;
  bufs.reserve(t.sent.size());
  for (auto& c : t.sent) bufs.push_back(uv_buf_init(reinterpret_cast<char*>(c.data()), c.size()));
  inflightBytes_ = t.readyBytes;
  queuedBytes_ -= std::min(queuedBytes_, t.readyBytes);
  t.readyBytes = 0;
  startWrite(bufs.data(), bufs.size());
}

namespace {
constexpr size_t kTlsBurstBytes = 4 << 20;
}  // namespace

// Seals queue_'s frames into the TLS records of tls_->io.out, at most kTlsBurstBytes of
// plaintext (the next write's completion seals the next): sealing a queue of 1 GiB at
// once held the loop thread for seconds, and the other links' frames and heartbeats with
// it. False (and the link closed) when TLS failed.
bool Connection::sealQueued() {
  Tls& t = *tls_;
  auto put = [&](const std::byte* data, size_t n) {
    while (n > 0) {
      size_t done = 0;
      if (SSL_write_ex(t.ssl, data, n, &done) != 1) {
        RLOG_WARN("transport") << "TLS to " << peer_ << " failed: " << tlsErrors();
        return false;
      }
      data = static_cast<const std::byte*>(data) + done;
      n -= done;
    }
    return true;
  };
  bool ok = true;
  size_t sealed = 0, consumed = 0;
  while (ok && consumed < queue_.size() && sealed < kTlsBurstBytes) {
    std::span<const std::byte> parts[2];
    if (auto* small = std::get_if<std::vector<std::byte>>(&queue_[consumed])) {
      parts[0] = *small;
    } else {
      auto& big = std::get<BigChunk>(queue_[consumed]);
      parts[0] = big.header;
      parts[1] = std::span<const std::byte>(big.body.data(), big.body.size());
    }
    size_t skip = sealedBytes_, budget = kTlsBurstBytes - sealed;
    for (auto part : parts) {
      if (skip >= part.size()) {
        skip -= part.size();
        continue;
      }
      size_t n = std::min(part.size() - skip, budget);
      ok = ok && put(part.data() + skip, n);
      skip = 0;
      budget -= n;
      sealed += n;
      sealedBytes_ += n;
    }
    if (sealedBytes_ < parts[0].size() + parts[1].size()) break;  // the budget ran out inside it
    sealedBytes_ = 0;
    ++consumed;
  }
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(consumed));
  queuedBytes_ -= std::min(queuedBytes_, sealed);
  if (!ok) close();
  return ok;
}

void Connection::flushTls() {
  Tls& t = *tls_;
  TlsErrorScope errors;
  if (!t.ssl) return;  // nothing has moved yet; queued frames wait for the handshake
  if (t.established && !sealQueued()) return;
  if (t.io.out.empty()) return;
  // The ciphertext made so far goes out as it is; `out` takes the last write's buffer
  // (no copy, and after the first bursts no allocation).
  t.sending.swap(t.io.out);
  t.io.out.clear();
  inflightBytes_ = t.sending.size();
  uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(t.sending.data()), t.sending.size());
  startWrite(&buf, 1);
}

size_t Connection::retainedBytes() const {
  if (!tls_) return 0;
  const Tls& t = *tls_;
  size_t bytes = t.sending.capacity();
  if (t.crypto) bytes += t.crypto->spareBytes();
  else bytes += t.io.out.capacity();  // (the thread's own while it runs)
  return bytes;
}

bool Connection::trimIdle() {
  const uint64_t moved = moved_ - movedAtTrim_;
  movedAtTrim_ = moved_;
  if (moved >= kTrimBelowBytes || !tls_ || closing_) return false;
  Tls& t = *tls_;
  if (!writing_) Bytes().swap(t.sending);
  if (t.crypto) t.crypto->releaseSpares();
  else if (t.io.out.empty()) Bytes().swap(t.io.out);
  return true;
}

namespace {
// Writes up to this size try the socket first (below).
constexpr size_t kTryWriteBytes = 256 << 10;
}  // namespace

// The one write in flight (its completion, wrote, starts the next). A small one goes
// straight to the socket first: most fit its buffer and are done there, without a
// request, whose completion re-arms the loop's watch of the socket (an epoll_ctl a write,
// a quarter of a relayed round trip's system calls); what does not fit goes as a request.
// A big one goes as a request at once: its completion comes back through the loop, so
// that a burst after burst of a long transfer lets the loop's other work run between.
void Connection::startWrite(const uv_buf_t* bufs, size_t count) {
  writeReq_.data = this;
  writing_ = true;
  ++writes_;
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += bufs[i].len;
  moved_ += total;
  const int n = total <= kTryWriteBytes ? uv_try_write(&handle_.stream, bufs, static_cast<unsigned>(count)) : UV_EAGAIN;
  if (n >= 0 && static_cast<size_t>(n) == total) {
    wrote(0);
    return;
  }
  std::vector<uv_buf_t> rest(bufs, bufs + count);
  auto first = rest.begin();
  for (size_t done = n > 0 ? static_cast<size_t>(n) : 0; done > 0;) {  // past what the socket took
    const size_t step = std::min(done, first->len);
    first->base += step;
    first->len -= step;
    done -= step;
    if (first->len == 0) ++first;
  }
  // (an error other than a full socket is the request's to report)
  int rc = uv_write(&writeReq_, &handle_.stream, &*first, static_cast<unsigned>(rest.end() - first), onWrite);
  if (rc != 0) {
    writing_ = false;
    RLOG_DEBUG("transport") << "write to " << peer_ << " failed: " << uv_strerror(rc);
    close();
  }
}

void Connection::start() {
  if (started_ || closing_) return;
  started_ = true;
  if (kind_ == Kind::tcp) uv_tcp_nodelay(&handle_.tcp, 1);
  resumeReading();
  if (tls_) receiveTls(nullptr, 0);  // a client's hello leaves now
}

void Connection::pauseReading() {
  paused_ = true;
  stopReading();
}

void Connection::stopReading() {
  if (reading_) {
    uv_read_stop(&handle_.stream);
    reading_ = false;
  }
}

void Connection::resumeReading() {
  paused_ = false;
  if (tls_ && tls_->inputFull) return;  // (the crypto thread's backlog resumes it)
  if (!reading_ && !closing_ && started_) {
    if (uv_read_start(&handle_.stream, onAlloc, onRead) == 0) reading_ = true;
  }
}

bool Connection::peerHungUp() const {
  uv_os_fd_t fd;
  if (closing_ || uv_fileno(&handle_.handle, &fd) != 0) return closing_;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

void Connection::onAlloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(handle->data);
  if (c->tls_ && c->tls_->crypto) {
    // Each read's ciphertext is the crypto thread's once read (its buffers recycled).
    auto& reading = c->tls_->reading;
    if (reading.size() < TlsCryptoThread::kReadBufferBytes) reading = c->tls_->crypto->buffer();
    buf->base = reinterpret_cast<char*>(reading.data());
    buf->len = reading.size();
    return;
  }
  if (c->tls_) {
    // Ciphertext is handed to OpenSSL before the next read, so every TLS connection of
    // this thread shares one buffer (an idle one holds none).
    thread_local std::vector<std::byte> cipher(256 * 1024);
    buf->base = reinterpret_cast<char*>(cipher.data());
    buf->len = cipher.size();
    return;
  }
  auto space = c->reader_.writable();
  buf->base = reinterpret_cast<char*>(space.data());
  buf->len = space.size();
}

void Connection::onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(stream->data);
  auto keep = c->shared_from_this();
  Cork cork;  // what its frames make goes out in one write per connection
  if (nread > 0) c->moved_ += static_cast<uint64_t>(nread);
  if (c->tls_ && c->tls_->crypto && nread != 0) {
    Tls& t = *c->tls_;
    if (nread > 0 && static_cast<size_t>(nread) <= TlsCryptoThread::kInlineBytes && t.crypto->claim()) {
      c->readInline(reinterpret_cast<const std::byte*>(buf->base), static_cast<size_t>(nread));
      return;
    }
    if (nread > 0) {
      t.reading.resize(static_cast<size_t>(nread));
      t.crypto->decrypt(std::move(t.reading));
      t.reading.clear();
      if (t.crypto->pendingInputBytes() >= TlsCryptoThread::kMaxInputBytes && c->reading_) {
        t.inputFull = true;  // until the thread catches up (onCryptoOutput)
        c->stopReading();
      }
      return;
    }
    if (nread == UV_EOF) {
      // The frames before the EOF are still being decrypted: the thread says when they
      // are all delivered, and the link closes then.
      c->stopReading();
      t.crypto->endOfInput();
      return;
    }
  }
  if (nread > 0 && c->tls_) {
    c->receiveTls(reinterpret_cast<const std::byte*>(buf->base), static_cast<size_t>(nread));
    if (!c->closing_ && c->callbacks_.onBatchEnd) c->callbacks_.onBatchEnd(*c);
    return;
  }
  if (nread > 0) {
    Sink sink(*c);
    c->reader_.commit(static_cast<size_t>(nread), sink);
    if (!c->closing_ && c->callbacks_.onBatchEnd) c->callbacks_.onBatchEnd(*c);
    return;
  }
  if (nread == 0) return;  // EAGAIN
  c->truncated_ = c->reader_.midFrame();
  if (nread != UV_EOF) RLOG_DEBUG("transport") << "read from " << c->peer_ << " failed: " << uv_strerror(nread);
  c->close();
}

void Connection::send(uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message) {
  if (closing_) return;
  if (queue_.empty() || !std::holds_alternative<std::vector<std::byte>>(queue_.back()) ||
      std::get<std::vector<std::byte>>(queue_.back()).size() > 256 * 1024)
    queue_.emplace_back(std::vector<std::byte>{});
  auto& out = std::get<std::vector<std::byte>>(queue_.back());
  size_t before = out.size();
  appendFrame(out, channel, sequence, message);
  queuedBytes_ += out.size() - before;
  flush();
}

void Connection::queueSmall(uint32_t channel, uint64_t sequence, const std::byte* body, size_t bytes) {
  // Coalesced with its neighbours instead of a write of its own.
  if (queue_.empty() || !std::holds_alternative<std::vector<std::byte>>(queue_.back()))
    queue_.emplace_back(std::vector<std::byte>{});
  auto& out = std::get<std::vector<std::byte>>(queue_.back());
  size_t at = out.size();
  out.resize(at + kHeaderBytes + bytes);
  encodeHeader(FrameHeader{channel, static_cast<uint32_t>(bytes), sequence}, out.data() + at);
  if (bytes) std::memcpy(out.data() + at + kHeaderBytes, body, bytes);
  queuedBytes_ += kHeaderBytes + bytes;
}

void Connection::sendBody(uint32_t channel, uint64_t sequence, Body body) {
  if (closing_) return;
  if (sendThroughLane(channel, sequence, body)) {
    // Its bytes are in the same-host lane; only a descriptor was queued.
  } else if (body.size() < FrameReader::kDirectBytes) {
    queueSmall(channel, sequence, body.data(), body.size());
  } else {
    BigChunk chunk;
    encodeHeader(FrameHeader{channel, static_cast<uint32_t>(body.size()), sequence}, chunk.header.data());
    queuedBytes_ += kHeaderBytes + body.size();
    chunk.body = std::move(body);
    queue_.emplace_back(std::move(chunk));
  }
  flush();
}

namespace {
thread_local int corkDepth = 0;
thread_local std::vector<std::shared_ptr<Connection>> corked;  // what waits for the outermost cork's end
}  // namespace

Connection::Cork::Cork() { ++corkDepth; }
Connection::Cork::~Cork() {
  if (--corkDepth > 0 || corked.empty()) return;
  auto list = std::move(corked);  // (a flush's failure may close and call back: nothing corks then)
  corked.clear();
  for (auto& c : list) {  // (a write that fails closes its connection: the others go on)
    if (!c->corked_) continue;
    c->corked_ = false;
    c->flushNow();
  }
}

void Connection::flush() {
  if (closing_) return;
  if (corkDepth > 0) {
    if (!corked_) corked_ = true, corked.push_back(shared_from_this());
    return;
  }
  flushNow();
}

void Connection::flushNow() {
  if (closing_) return;
  if (tls_ && tls_->crypto) {
    // Frames queued while a write is in flight wait for the next one (as without the
    // thread), unless a burst's worth waits: that is sealed meanwhile.
    if (writing_ && queuedPlainBytes() < TlsCryptoThread::kSealBurstBytes) return;
    flushCrypto();
    return;
  }
  if (writing_) return;
  if (tls_) {
    flushTls();
    return;
  }
  if (queue_.empty()) return;
  inflight_.swap(queue_);
  inflightBytes_ = queuedBytes_;
  queuedBytes_ = 0;
  std::vector<uv_buf_t> bufs;
  bufs.reserve(inflight_.size() * 2);
  for (auto& chunk : inflight_) {
    if (auto* small = std::get_if<std::vector<std::byte>>(&chunk)) {
      bufs.push_back(uv_buf_init(reinterpret_cast<char*>(small->data()), small->size()));
    } else {
      auto& big = std::get<BigChunk>(chunk);
      bufs.push_back(uv_buf_init(reinterpret_cast<char*>(big.header.data()), kHeaderBytes));
      bufs.push_back(uv_buf_init(reinterpret_cast<char*>(big.body.data()), big.body.size()));
    }
  }
  startWrite(bufs.data(), bufs.size());
}

void Connection::onWrite(uv_write_t* req, int status) { static_cast<Connection*>(req->data)->wrote(status); }

void Connection::wrote(int status) {
  auto keep = shared_from_this();
  writing_ = false;
  inflight_.clear();
  if (tls_) {
    if (tls_->crypto)
      for (auto& b : tls_->sent) tls_->crypto->recycleCipher(std::move(b));
    tls_->sent.clear();
  }
  inflightBytes_ = 0;

  if (status != 0) {
    if (status != UV_ECANCELED) RLOG_DEBUG("transport") << "write to " << peer_ << " failed: " << uv_strerror(status);
    close();
    return;
  }
  flush();
  if (!drainWaiters_.empty() && backlogBytes() < kHighWater / 2) {
    auto waiters = std::move(drainWaiters_);
    drainWaiters_.clear();
    for (auto& fn : waiters) fn();
  }
}

void Connection::whenDrained(std::function<void()> fn) {
  if (backlogBytes() < kHighWater / 2 || closing_) fn();
  else drainWaiters_.push_back(std::move(fn));
}

void Connection::throttle(Connection& source) {
  if (backlogBytes() <= kHighWater) return;
  source.pauseReading();
  std::weak_ptr<Connection> weak = source.shared_from_this();
  whenDrained([weak] {
    if (auto c = weak.lock()) c->resumeReading();
  });
}

void Connection::close() {
  if (closing_) return;
  if (corked_) {  // what a cork holds leaves first, as it would have without one
    corked_ = false;
    flushNow();
    if (closing_) return;  // (the write failed and closed it)
  }
  closing_ = true;
  closeLanes();
  reading_ = false;
  if (tls_ && tls_->crypto) {
    // The thread stops (after its current step) before its wake-up handle goes; the
    // connection is finished once both handles are closed.
    tls_->crypto.reset();
    ++closesPending_;
    uv_close(reinterpret_cast<uv_handle_t*>(&tls_->wake), onHandleClosed);
  }
  ++closesPending_;
  uv_close(&handle_.handle, onHandleClosed);
}

void Connection::onHandleClosed(uv_handle_t* handle) {
  auto* c = static_cast<Connection*>(handle->data);
  if (--c->closesPending_ == 0) c->finishClose();
}

void Connection::finishClose() {
  auto keep = std::move(self_);
  if (tls_) {
    tls_->ready.clear();
    tls_->sent.clear();
  }
  queue_.clear();
  sealedBytes_ = 0;
  inflight_.clear();
  queuedBytes_ = inflightBytes_ = 0;
  // Sources paused behind this connection must not stay paused forever.
  auto waiters = std::move(drainWaiters_);
  drainWaiters_.clear();
  for (auto& fn : waiters) fn();
  if (callbacks_.onClose) callbacks_.onClose(*this, truncated_);
  callbacks_ = {};
}

Result<Address> parseAddress(const std::string& text) {
  Address a;
  if (text.rfind("unix:", 0) == 0 || (!text.empty() && (text[0] == '/' || text[0] == '.'))) {
    a.isUnix = true;
    a.path = text.rfind("unix:", 0) == 0 ? text.substr(5) : text;
    if (a.path.empty()) return fail(Code::invalidArgument, "empty unix socket path in '" + text + "'");
    if (a.path.size() >= sizeof(sockaddr_un::sun_path))
      return fail(Code::invalidArgument, "unix socket path too long (max 107 bytes): " + a.path);
    return a;
  }
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return fail(Code::invalidArgument, "'" + text + "' is not an address (use host:port or unix:/path)");
  a.host = text.substr(0, colon);
  char* end = nullptr;
  long port = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    return fail(Code::invalidArgument, "'" + text + "': bad port");
  a.port = static_cast<int>(port);
  return a;
}

Result<std::unique_ptr<Listener>> Listener::listen(uv_loop_t* loop, const Address& address, uint32_t maxFrameBytes,
                                                   AcceptFn onAccept, int mode) {
  std::unique_ptr<Listener> l(new Listener());
  l->address_ = address;
  l->maxFrameBytes_ = maxFrameBytes;
  l->onAccept_ = std::move(onAccept);
  l->handle_ = new std::remove_pointer_t<decltype(l->handle_)>;
  int rc;
  if (address.isUnix) {
    uv_pipe_init(loop, &l->handle_->pipe, 0);
    struct stat st;
    if (::stat(address.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(address.path.c_str());
    rc = uv_pipe_bind(&l->handle_->pipe, address.path.c_str());
    if (rc == 0) ::chmod(address.path.c_str(), mode);
  } else {
    uv_tcp_init(loop, &l->handle_->tcp);
    sockaddr_storage addr;
    rc = uv_ip4_addr(address.host.c_str(), address.port, reinterpret_cast<sockaddr_in*>(&addr));
    if (rc != 0) rc = uv_ip6_addr(address.host.c_str(), address.port, reinterpret_cast<sockaddr_in6*>(&addr));
    if (rc == 0) rc = uv_tcp_bind(&l->handle_->tcp, reinterpret_cast<sockaddr*>(&addr), 0);
  }
  l->handle_->handle.data = l.get();
  if (rc == 0) rc = uv_listen(&l->handle_->stream, 128, onConnection);
  if (rc != 0) {
    std::string what = "cannot listen on " + address.toString() + ": " + uv_strerror(rc);
    l->close();
    return fail(Code::unavailable, what);
  }
  return l;
}

Listener::~Listener() { close(); }

void Listener::close() {
  if (!handle_) return;
  uv_close(&handle_->handle, [](uv_handle_t* h) { delete reinterpret_cast<decltype(handle_)>(h); });
  handle_ = nullptr;
}

int Listener::port() const {
  if (!handle_ || address_.isUnix) return 0;
  sockaddr_storage addr;
  int len = sizeof addr;
  if (uv_tcp_getsockname(&handle_->tcp, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void Listener::onConnection(uv_stream_t* server, int status) {
  auto* l = static_cast<Listener*>(server->data);
  if (status != 0) return;
  auto c = Connection::create(server->loop, l->address_.isUnix ? Connection::Kind::pipe : Connection::Kind::tcp,
                              l->maxFrameBytes_);
  if (uv_accept(server, c->stream()) != 0) {
    c->close();
    return;
  }
  c->setPeer(l->address_.isUnix ? l->address_.path : "tcp");
  if (!l->address_.isUnix) {
    sockaddr_storage addr;
    int len = sizeof addr;
    char host[64] = "?";
    if (uv_tcp_getpeername(reinterpret_cast<uv_tcp_t*>(c->stream()), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      uv_ip4_name(reinterpret_cast<sockaddr_in*>(&addr), host, sizeof host);
      c->setPeer(std::string(host) + ":" + std::to_string(ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)));
    }
  }
  l->onAccept_(std::move(c));
}

namespace {
struct ConnectReq {
  uv_connect_t req;
  ConnectionPtr connection;
  std::function<void(Result<ConnectionPtr>)> done;
  std::string what;
};
void onConnected(uv_connect_t* req, int status) {
  std::unique_ptr<ConnectReq> r(static_cast<ConnectReq*>(req->data));
  if (status != 0) {
    r->connection->close();
    r->done(fail(Code::unavailable, "cannot connect to " + r->what + ": " + uv_strerror(status)));
    return;
  }
  r->done(std::move(r->connection));
}
}  // namespace

void connect(uv_loop_t* loop, const Address& address, uint32_t maxFrameBytes,
             std::function<void(Result<ConnectionPtr>)> done) {
  auto* r = new ConnectReq;
  r->req.data = r;
  r->done = std::move(done);
  r->what = address.toString();
  r->connection = Connection::create(loop, address.isUnix ? Connection::Kind::pipe : Connection::Kind::tcp, maxFrameBytes);
  r->connection->setPeer(r->what);
  if (address.isUnix) {
    uv_pipe_connect(&r->req, reinterpret_cast<uv_pipe_t*>(r->connection->stream()), address.path.c_str(), onConnected);
    return;
  }
  sockaddr_in addr;
  int rc = uv_ip4_addr(address.host == "localhost" ? "127.0.0.1" : address.host.c_str(), address.port, &addr);
  if (rc == 0)
    rc = uv_tcp_connect(&r->req, reinterpret_cast<uv_tcp_t*>(r->connection->stream()),
                        reinterpret_cast<sockaddr*>(&addr), onConnected);
  if (rc != 0) {
    // Reported at once (before connect() returns), unlike a failed connection attempt.
    r->connection->close();
    auto fn = std::move(r->done);
    std::string what = "cannot connect to " + r->what + ": " + uv_strerror(rc);
    delete r;
    fn(fail(Code::unavailable, what));
  }
}

Result<ConnectionPtr> openDevice(uv_loop_t* loop, const std::string& path, uint32_t maxFrameBytes) {
  int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return fail(Code::unavailable, "cannot open " + path + ": " + std::strerror(errno));
  // A virtio-serial port opens fine while its host side is absent, then reports HUP
  // (and reads return EOF) until the host connects. Writing then would lose the bytes,
  // so a port in that state counts as not there yet.
  pollfd p{fd, POLLIN | POLLOUT, 0};
  if (::poll(&p, 1, 0) == 1 && (p.revents & POLLHUP)) {
    ::close(fd);
    return fail(Code::unavailable, "the host side of " + path + " is not connected");
  }
  auto c = Connection::create(loop, Connection::Kind::pipe, maxFrameBytes);
  int rc = uv_pipe_open(reinterpret_cast<uv_pipe_t*>(c->stream()), fd);
  if (rc != 0) {
    ::close(fd);
    c->close();
    return fail(Code::unavailable, "cannot use " + path + " as a stream: " + uv_strerror(rc));
  }
  c->setPeer(path);
  return c;
}

}  // namespace raccel::transport
