// Mutual TLS 1.3 for framed links (OpenSSL), used between the scheduler and every
// netaccel. A TlsContext holds the pool CA, this side's certificate and key; a
// Connection given one (Connection::useTls) runs the handshake over its libuv stream
// through memory BIOs and delivers frames only once the peer's certificate has been
// verified. Contexts are immutable after creation and may be shared by connections of
// one loop thread.
//
// Identity: both sides must present a certificate that chains to the pool CA. The
// scheduler's certificate carries the DNS name kSchedulerName (checked by netaccels);
// a netaccel's certificate's common name is its node name (the scheduler takes the name
// from there, never from a message). scripts/raccel-certs.sh makes all of them.
#pragma once

#include <memory>
#include <string>

#include <vector>

#include "common/config.h"
#include "common/error.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace raccel::transport {

constexpr const char* kSchedulerName = "raccel-scheduler";

struct TlsFiles {
  std::string ca;    // PEM: the pool CA's certificate
  std::string cert;  // PEM: this side's certificate (chain)
  std::string key;   // PEM: its private key
  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

class TlsContext {
 public:
  enum class Role { server, client };
  // Loads and checks the files (the key must match the certificate); an error names
  // the file and OpenSSL's reason.
  // `cryptoThread`: each link's cipher work runs on a thread of its own once its
  // handshake is done (transport/tls_crypto.h).
  static Result<std::shared_ptr<TlsContext>> create(Role role, const TlsFiles& files, bool cryptoThread = false);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  Role role() const { return role_; }
  SSL_CTX* native() const { return ctx_; }
  // The common name of this side's own certificate (a netaccel's node name).
  const std::string& ownName() const { return ownName_; }
  bool cryptoThread() const { return cryptoThread_; }

 private:
  TlsContext() = default;
  Role role_ = Role::server;
  SSL_CTX* ctx_ = nullptr;
  std::string ownName_;
  bool cryptoThread_ = false;
};

// How a daemon's netaccel link is secured, from its config's top level (the same keys
// for the scheduler and the netaccel): tls_ca, tls_cert, tls_key (PEM files), or
// insecure = true for plain TCP (loopback development only). tlsFor() refuses neither.
// tls_crypto_thread = auto | on | off: a thread per link for its cipher work; auto (the
// default) is on where the machine has kCryptoThreadCores cores or more (on fewer, the
// cores are busy anyway and the hand-overs cost more than they free).
struct LinkSecurity {
  TlsFiles files;
  bool insecure = false;
  bool cryptoThread = false;  // resolved (auto -> the cores)
};
constexpr unsigned kCryptoThreadCores = 4;
Result<LinkSecurity> linkSecurityFrom(const ConfigSection& top);
inline const std::vector<std::string> kLinkSecurityKeys = {"tls_ca", "tls_cert", "tls_key", "insecure", "tls_crypto_thread"};
// The context for `role`, or null with `insecure` (after warning, naming `what`).
Result<std::shared_ptr<TlsContext>> tlsFor(TlsContext::Role role, const LinkSecurity& security, const std::string& what);

// OpenSSL's error queue as one line (and cleared).
std::string tlsErrors();

// OpenSSL keeps one error queue per thread, shared by every link of a loop: an error one
// link leaves behind makes SSL_get_error() report SSL_ERROR_SSL on the next link's
// healthy read. Every TLS step of a connection runs inside one of these: the queue is
// empty when the step starts and when it ends, whatever path it takes, so one link's
// failure can never be read as another's.
class TlsErrorScope {
 public:
  TlsErrorScope();
  ~TlsErrorScope();
  TlsErrorScope(const TlsErrorScope&) = delete;
  TlsErrorScope& operator=(const TlsErrorScope&) = delete;
};

}  // namespace raccel::transport
