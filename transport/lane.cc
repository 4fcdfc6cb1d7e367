#include "transport/lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"

namespace raccel::transport {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {
std::string errnoText(const std::string& what) { return what + ": " + std::strerror(errno); }
constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
constexpr size_t kAlign = 64;
}  // namespace

Result<UniqueFd> makeLaneMemfd(size_t bytes) {
  UniqueFd fd(::memfd_create("raccel-lane", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return fail(Code::unavailable, errnoText("memfd_create"));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return fail(Code::resourceExhausted, errnoText("ftruncate"));
  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals) != 0) return fail(Code::unavailable, errnoText("sealing a memfd"));
  return fd;
}

Result<std::shared_ptr<LaneMapping>> LaneMapping::map(const UniqueFd& fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(Code::invalidArgument, errnoText("fstat of a lane memfd"));
  if (!S_ISREG(st.st_mode)) return fail(Code::invalidArgument, "a lane's fd is not a memfd");
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals)
    return fail(Code::invalidArgument, "a lane's memfd is not sealed against resizing");
  const auto size = static_cast<uint64_t>(st.st_size);
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (st.st_size < 0 || size < kMinLaneBytes || size > kMaxLaneBytes || size % page != 0)
    return fail(Code::invalidArgument, "a lane's memfd has " + std::to_string(st.st_size) + " bytes (must be a page multiple from " +
                                           std::to_string(kMinLaneBytes) + " to " + std::to_string(kMaxLaneBytes) + ")");
  void* at = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (at == MAP_FAILED) return fail(Code::invalidArgument, errnoText("mapping a lane's memfd"));
  return std::shared_ptr<LaneMapping>(new LaneMapping(static_cast<std::byte*>(at), size));
}

LaneMapping::~LaneMapping() { ::munmap(data_, size_); }

std::optional<uint64_t> LaneOut::reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return reserveLocked(bytes, State::sent);
}

namespace {
uint64_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

// Where `need` aligned bytes go next in ring order, if they fit.
std::optional<uint64_t> LaneOut::placeLocked(uint64_t need) const {
  const uint64_t size = mapping_->size();
  if (spans_.empty()) return need <= size ? std::optional<uint64_t>(0) : std::nullopt;
  const Span& oldest = spans_.front();
  const Span& newest = spans_.back();
  const uint64_t end = newest.offset + newest.reserved;
  if (newest.offset >= oldest.offset) {  // not wrapped: free after the newest, then before the oldest
    if (size - end >= need) return end;
    if (oldest.offset >= need) return 0;
    return std::nullopt;
  }
  if (oldest.offset - end < need) return std::nullopt;  // wrapped: free between the newest and the oldest
  return end;
}

std::optional<uint64_t> LaneOut::reserveLocked(size_t bytes, State state) {
  if (bytes == 0 || bytes > mapping_->size()) return std::nullopt;
  const uint64_t need = aligned(bytes);
  auto at = placeLocked(need);
  if (!at) return std::nullopt;
  spans_.push_back(Span{*at, bytes, need, state});
  outstanding_ += bytes;
  return at;
}

Body LaneOut::buildIn(const std::shared_ptr<LaneOut>& lane, size_t bytes, unsigned waitMs) {
  std::optional<uint64_t> at;
  {
    std::unique_lock<std::mutex> lock(lane->mu_);
    at = lane->reserveLocked(bytes, State::building);
    if (!at && waitMs > 0 && !lane->stalled_ && bytes <= lane->mapping_->size()) {
      const uint64_t need = aligned(bytes);
      ++lane->waiting_;
      const bool room =
          lane->room_.wait_for(lock, std::chrono::milliseconds(waitMs), [&] { return lane->placeLocked(need).has_value(); });
      --lane->waiting_;
      if (room) at = lane->reserveLocked(bytes, State::building);
      else lane->stalled_ = true;  // the peer is not reading: the next builds go by the socket at once
    }
  }
  if (!at) return Body();
  return Body::external(lane->at(*at), bytes, [lane, offset = *at] { lane->dropped(offset); });
}

std::optional<uint64_t> LaneOut::claim(const Body& body) {
  const std::byte* p = body.data();
  if (!p || p < mapping_->data() || p >= mapping_->data() + mapping_->size()) return std::nullopt;
  const auto offset = static_cast<uint64_t>(p - mapping_->data());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : spans_) {
    if (s.offset != offset) continue;
    if (s.state != State::building || body.size() == 0 || body.size() > s.bytes) return std::nullopt;
    outstanding_ -= s.bytes - body.size();
    s.bytes = body.size();
    s.state = State::sent;
    return offset;
  }
  return std::nullopt;
}

void LaneOut::dropped(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : spans_) {
    if (s.offset != offset || s.state != State::building) continue;
    s.state = State::released;  // never sent: free now (sent ones wait for the peer)
    outstanding_ -= s.bytes;
    popReleased();
    room_.notify_all();
    return;
  }
}

bool LaneOut::release(uint64_t offset, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : spans_) {
    if (s.offset != offset || s.state == State::released) continue;
    if (s.state != State::sent || s.bytes != bytes) return false;
    s.state = State::released;
    outstanding_ -= bytes;
    popReleased();
    stalled_ = false;  // the peer reads again
    room_.notify_all();
    return true;
  }
  return false;
}

void LaneOut::popReleased() {
  while (!spans_.empty() && spans_.front().state == State::released) spans_.pop_front();
}

size_t LaneOut::outstandingBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

size_t LaneOut::waitingBuilds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

void LaneReleases::give(uint64_t offset, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!wake_) return;
  done_.emplace_back(offset, bytes);
  uv_async_send(wake_);
}

std::vector<std::pair<uint64_t, uint64_t>> LaneReleases::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(done_, {});
}

void LaneReleases::setWake(uv_async_t* wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = wake;
}

// ---- the lane socket ----

namespace {
constexpr size_t kMaxPendingOffers = 8;

sockaddr_un unixAddress(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}
}  // namespace

struct LaneListener::Pending {
  LaneListener* owner;
  UniqueFd fd;
  uv_poll_t* poll = nullptr;
};

Result<std::unique_ptr<LaneListener>> LaneListener::listen(uv_loop_t* loop, const std::string& path, OfferFn onOffer) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path))
    return fail(Code::invalidArgument, "lane socket path '" + path + "' is empty or over 107 bytes");
  std::unique_ptr<LaneListener> l(new LaneListener());
  l->loop_ = loop;
  l->path_ = path;
  l->onOffer_ = std::move(onOffer);
  l->fd_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!l->fd_) return fail(Code::unavailable, errnoText("lane socket"));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());  // a stale one
  sockaddr_un a = unixAddress(path);
  // Bound with no permissions for anyone else from the start (then made 0600).
  mode_t old = ::umask(0177);
  int rc = ::bind(l->fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (rc != 0) return fail(Code::unavailable, errnoText("binding the lane socket " + path));
  if (::listen(l->fd_.get(), 16) != 0) return fail(Code::unavailable, errnoText("listening on the lane socket " + path));
  l->poll_ = new uv_poll_t;
  uv_poll_init(loop, l->poll_, l->fd_.get());
  l->poll_->data = l.get();
  l->retry_ = new uv_timer_t;
  uv_timer_init(loop, l->retry_);
  l->retry_->data = l.get();
  uv_poll_start(l->poll_, UV_READABLE, readable);
  return l;
}

LaneListener::~LaneListener() {
  while (!pending_.empty()) drop(*pending_.front());
  if (poll_) uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
  if (retry_) uv_close(reinterpret_cast<uv_handle_t*>(retry_), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  if (fd_) ::unlink(path_.c_str());
}

void LaneListener::readable(uv_poll_t* handle, int, int) { static_cast<LaneListener*>(handle->data)->acceptAll(); }

void LaneListener::acceptAll() {
  for (;;) {
    UniqueFd c(::accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
      // Out of descriptors: the connection stays queued and the socket readable. Look
      // again in a while rather than spin on it.
      RLOG_WARN("transport") << errnoText("accepting on the lane socket " + path_) << "; pausing it 1 s";
      uv_poll_stop(poll_);
      uv_timer_start(retry_, [](uv_timer_t* t) {
        auto* l = static_cast<LaneListener*>(t->data);
        uv_poll_start(l->poll_, UV_READABLE, readable);
      }, 1000, 0);
      return;
    }
    if (!c) return;  // EAGAIN, or a peer that went already
    // Bounded: a peer that connects and says nothing makes room for the next.
    if (pending_.size() >= kMaxPendingOffers) drop(*pending_.front());
    auto p = std::make_unique<Pending>();
    p->owner = this;
    p->fd = std::move(c);
    p->poll = new uv_poll_t;
    uv_poll_init(loop_, p->poll, p->fd.get());
    p->poll->data = p.get();
    Pending& raw = *p;
    pending_.push_back(std::move(p));
    uv_poll_start(raw.poll, UV_READABLE | UV_DISCONNECT, [](uv_poll_t* h, int, int) {
      auto* p = static_cast<Pending*>(h->data);
      p->owner->receive(*p);
    });
  }
}

void LaneListener::drop(Pending& p) {
  uv_close(reinterpret_cast<uv_handle_t*>(p.poll), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
  for (auto it = pending_.begin(); it != pending_.end(); ++it)
    if (it->get() == &p) {
      pending_.erase(it);
      return;
    }
}

void LaneListener::receive(Pending& p) {
  char token[kLaneTokenBytes + 1];
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
  iovec iov{token, sizeof token};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(p.fd.get(), &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  // Whatever fds came are owned (and closed) here, whether or not the offer is good.
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); n >= 0 && c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.emplace_back(fd);
    }
  }
  const bool good = n == static_cast<ssize_t>(kLaneTokenBytes) && fds.size() == 2 && !(m.msg_flags & (MSG_CTRUNC | MSG_TRUNC));
  std::string said(token, good ? kLaneTokenBytes : 0);
  drop(p);  // one message a connection, good or not
  if (!good) {
    RLOG_WARN("transport") << "a lane offer on " << path_ << " was malformed (" << n << " bytes, " << fds.size()
                           << " fds); ignored";
    return;
  }
  onOffer_(said, std::move(fds[0]), std::move(fds[1]));
}

Status offerLane(const std::string& path, const std::string& token, const UniqueFd& up, const UniqueFd& down) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path) || token.size() != kLaneTokenBytes)
    return fail(Code::invalidArgument, "a lane offer needs a unix socket path and a token of " + std::to_string(kLaneTokenBytes) + " bytes");
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) return fail(Code::unavailable, errnoText("lane socket"));
  sockaddr_un a = unixAddress(path);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return fail(Code::unavailable, errnoText("connecting to the lane socket " + path));
  int fds[2] = {up.get(), down.get()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{const_cast<char*>(token.data()), token.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  if (::sendmsg(s.get(), &m, MSG_NOSIGNAL) != static_cast<ssize_t>(token.size()))
    return fail(Code::unavailable, errnoText("handing the lane over " + path));
  return {};
}

Result<HandedLane> handOverLane(const std::string& path, const std::string& token, size_t bytes) {
  auto up = makeLaneMemfd(bytes);
  if (!up) return fail(up.error());
  auto down = makeLaneMemfd(bytes);
  if (!down) return fail(down.error());
  HandedLane lane;
  for (auto [fd, map] : {std::pair{&*up, &lane.up}, std::pair{&*down, &lane.down}}) {
    auto mapped = LaneMapping::map(*fd);
    if (!mapped) return fail(mapped.error());
    *map = *mapped;
  }
  if (auto handed = offerLane(path, token, *up, *down); !handed) return fail(handed.error());
  return lane;
}

std::string newLaneToken() {
  std::string t(kLaneTokenBytes, '\0');
  size_t got = 0;
  while (got < t.size()) {
    ssize_t n = ::getrandom(t.data() + got, t.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return t;
}

}  // namespace raccel::transport
