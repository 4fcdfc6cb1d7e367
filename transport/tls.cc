#include "transport/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <thread>

#include "common/log.h"

namespace raccel::transport {

std::string tlsErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? "unknown TLS error" : out;
}

// Emptied only when something is in it: ERR_clear_error() walks and frees every slot of
// the queue, and was the busiest of libcrypto's functions in a scheduler relaying round
// trips over TLS (two scopes a record); ERR_peek_error() only looks at its ends.
namespace {
void emptyErrorQueue() {
  if (ERR_peek_error() != 0) ERR_clear_error();
}
}  // namespace
TlsErrorScope::TlsErrorScope() { emptyErrorQueue(); }
TlsErrorScope::~TlsErrorScope() { emptyErrorQueue(); }

namespace {
std::string commonName(X509* cert) {
  char cn[256] = "";
  int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  return n > 0 ? std::string(cn, static_cast<size_t>(n)) : std::string();
}
}  // namespace

Result<std::shared_ptr<TlsContext>> TlsContext::create(Role role, const TlsFiles& files, bool cryptoThread) {
  if (files.ca.empty() || files.cert.empty() || files.key.empty())
    return fail(Code::invalidArgument, "TLS needs the pool CA, a certificate and its key (tls_ca, tls_cert, tls_key; "
                                       "scripts/raccel-certs.sh makes them)");
  std::shared_ptr<TlsContext> t(new TlsContext());
  t->role_ = role;
  t->cryptoThread_ = cryptoThread;
  t->ctx_ = SSL_CTX_new(role == Role::server ? TLS_server_method() : TLS_client_method());
  if (!t->ctx_) return fail(Code::internal, "cannot create a TLS context: " + tlsErrors());
  SSL_CTX_set_min_proto_version(t->ctx_, TLS1_3_VERSION);
  SSL_CTX_set_mode(t->ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE);
  // Bulk links: AES-128-GCM first (hardware AES, the fastest of TLS 1.3's suites here),
  // and records read ahead from the memory BIO in one go.
  SSL_CTX_set_ciphersuites(t->ctx_, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_read_ahead(t->ctx_, 1);
  // No resumption tickets: every link proves its certificate afresh.
  SSL_CTX_set_num_tickets(t->ctx_, 0);
  SSL_CTX_set_session_cache_mode(t->ctx_, SSL_SESS_CACHE_OFF);
  if (SSL_CTX_load_verify_locations(t->ctx_, files.ca.c_str(), nullptr) != 1)
    return fail(Code::invalidArgument, "cannot read the pool CA " + files.ca + ": " + tlsErrors());
  if (SSL_CTX_use_certificate_chain_file(t->ctx_, files.cert.c_str()) != 1)
    return fail(Code::invalidArgument, "cannot read the certificate " + files.cert + ": " + tlsErrors());
  if (SSL_CTX_use_PrivateKey_file(t->ctx_, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return fail(Code::invalidArgument, "cannot read the private key " + files.key + ": " + tlsErrors());
  if (SSL_CTX_check_private_key(t->ctx_) != 1)
    return fail(Code::invalidArgument, "the key " + files.key + " does not match the certificate " + files.cert);
  // Both sides must show a certificate of the pool CA, for the right purpose (a node's
  // client certificate cannot pose as the scheduler, nor the reverse).
  SSL_CTX_set_verify(t->ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_verify_depth(t->ctx_, 4);
  SSL_CTX_set_purpose(t->ctx_, role == Role::server ? X509_PURPOSE_SSL_CLIENT : X509_PURPOSE_SSL_SERVER);
  if (role == Role::server) SSL_CTX_set_client_CA_list(t->ctx_, SSL_load_client_CA_file(files.ca.c_str()));
  if (X509* own = SSL_CTX_get0_certificate(t->ctx_)) t->ownName_ = commonName(own);
  return t;
}

Result<LinkSecurity> linkSecurityFrom(const ConfigSection& top) {
  LinkSecurity out;
  out.files.ca = top.getString("tls_ca", "");
  out.files.cert = top.getString("tls_cert", "");
  out.files.key = top.getString("tls_key", "");
  auto insecure = top.getBool("insecure", false);
  if (!insecure) return fail(insecure.error());
  out.insecure = *insecure;
  const std::string thread = top.getString("tls_crypto_thread", "auto");
  if (thread == "auto") out.cryptoThread = std::thread::hardware_concurrency() >= kCryptoThreadCores;
  else if (thread == "on") out.cryptoThread = true;
  else if (thread == "off") out.cryptoThread = false;
  else return fail(Code::invalidArgument, "tls_crypto_thread must be auto, on or off, not '" + thread + "'");
  if (out.insecure && !out.files.empty())
    return fail(Code::invalidArgument, "give either TLS files (tls_ca, tls_cert, tls_key) or insecure, not both");
  return out;
}

Result<std::shared_ptr<TlsContext>> tlsFor(TlsContext::Role role, const LinkSecurity& security, const std::string& what) {
  if (security.insecure) {
    RLOG_WARN("transport") << what << " is plain TCP (--insecure): anyone who reaches it can "
                           << (role == TlsContext::Role::server ? "register cards and be sent guests' data"
                                                                : "pose as the scheduler")
                           << "; for loopback development only";
    return std::shared_ptr<TlsContext>();
  }
  if (security.files.ca.empty() || security.files.cert.empty() || security.files.key.empty())
    return fail(Code::invalidArgument,
                "the netaccel link needs mutual TLS: give tls_ca, tls_cert and tls_key (--tls-ca, --tls-cert, --tls-key; "
                "scripts/raccel-certs.sh makes them), or --insecure for plain TCP on loopback during development");
  auto made = TlsContext::create(role, security.files, security.cryptoThread);
  if (made && security.cryptoThread)
    RLOG_INFO("transport") << what << ": each TLS link's cipher work on a thread of its own (tls_crypto_thread)";
  return made;
}

TlsContext::~TlsContext() {
  if (ctx_) SSL_CTX_free(ctx_);
}

}  // namespace raccel::transport
