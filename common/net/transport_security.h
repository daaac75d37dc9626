// Transport security for every gRPC hop (client -> coordinator, worker <-> coordinator, worker <->
// worker): the one place that turns `--tls-cert/--tls-key/--tls-ca` into gRPC credentials, checks
// a listen address against the secure-by-default rule and reads a peer's certificate names.
//
// Credentials use gRPC 1.51's TLS API (grpc::experimental::TlsServerCredentials / TlsCredentials)
// with a FileWatcherCertificateProvider: the certificate, key and CA files are re-read every
// TlsOptions::refresh_interval, so a renewed certificate takes effect without a restart (existing
// connections keep the identity they were made with). Servers require and verify the peer's
// certificate against the CA (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY) unless
// asked for ClientCertificate::kOptional (the coordinator's token-only client port); channels
// verify the server's certificate and that it names the host dialled. docs/security.md.
//
// All functions are thread-safe (they share no state).
#ifndef PIPETRAIN_COMMON_NET_TRANSPORT_SECURITY_H_
#define PIPETRAIN_COMMON_NET_TRANSPORT_SECURITY_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class AuthContext;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace pipetrain::net {

// A process's TLS identity and trust root (PEM files). All three empty (the default): plaintext.
struct TlsOptions {
  // This process's certificate (chain), sent to its peers. --tls-cert.
  std::string cert_file;
  // The private key of cert_file. --tls-key.
  std::string key_file;
  // The CA certificate(s) that sign the peers this process accepts. --tls-ca.
  std::string ca_file;
  // How often gRPC re-reads the three files (a changed file is used for new connections).
  // Default 60 s.
  absl::Duration refresh_interval = absl::Seconds(60);

  // True when any file is named (TLS is on; Check says whether the set is complete).
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }

  // OK for plaintext (nothing named) or a usable set; INVALID_ARGUMENT naming the missing flag
  // otherwise. With TLS, ca_file is always needed and cert_file/key_file come together; a daemon
  // (`need_identity`) must have both.
  absl::Status Check(bool need_identity) const;
};

// What a certificate file says about its first certificate.
struct CertificateInfo {
  std::string subject;    // one-line distinguished name, e.g. "CN=worker-0".
  absl::Time not_before;  // validity period.
  absl::Time not_after;
  std::vector<std::string> names;  // DNS and IP subject alternative names, as text.
};

// Reads the first certificate of the PEM file at `path`. NOT_FOUND / PERMISSION_DENIED if it
// cannot be read, INVALID_ARGUMENT if it holds no PEM certificate; messages name the path.
absl::StatusOr<CertificateInfo> ReadCertificateInfo(const std::string& path);

// Checks every file of `options` (TLS on) before a process starts with them: each readable, the
// certificates parse, the key parses and matches cert_file, cert_file is within its validity
// period. Returns one line for the log, e.g. "TLS: certificate CN=w0 (names 127.0.0.1) valid until
// 2027-11-23 12:00 UTC (364 days); CA ca.pem". Errors: INVALID_ARGUMENT (bad or mismatched
// files, certificate expired or not yet valid) and NOT_FOUND / PERMISSION_DENIED naming the flag
// and the path.
absl::StatusOr<std::string> CheckTlsFiles(const TlsOptions& options);

// Whether a TLS server demands a certificate from every client or only verifies one if sent.
enum class ClientCertificate { kRequired, kOptional };

// Server credentials: insecure without TLS, else TLS with a FileWatcherCertificateProvider
// (options.refresh_interval) and the given client-certificate policy. Returns
// options.Check(true)'s errors and CheckTlsFiles's; the caller logs nothing on success.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options, ClientCertificate client_certificate = ClientCertificate::kRequired);

// Channel credentials: insecure without TLS, else TLS verifying the server against ca_file and
// presenting cert_file/key_file when given. A non-empty `bearer_token` is sent on every call as
// "authorization: Bearer <token>" (needs TLS: INVALID_ARGUMENT otherwise, never sent in clear).
// Errors as for MakeServerCredentials (options.Check(false)).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& options, const std::string& bearer_token = "");

// True if the host of `address` ("host:port", "[v6]:port" or a bare host) is a loopback name:
// localhost, 127.0.0.0/8 or ::1.
bool IsLoopbackAddress(absl::string_view address);

// The secure-by-default rule for a daemon listening on `address` (named by `flag`, e.g.
// "--listen"): OK if TLS is on, the address is loopback, or `insecure` was given; otherwise
// FAILED_PRECONDITION saying why and what to pass.
absl::Status CheckListenSecurity(absl::string_view flag, absl::string_view address, bool tls,
                                 bool insecure);

// The DNS and IP subject alternative names of the peer's verified certificate ("x509_subject_
// alternative_name" of its auth context); empty for a peer without one (plaintext, no certificate).
std::vector<std::string> PeerCertificateNames(const grpc::AuthContext& context);

// True if the peer presented a certificate the server verified.
bool PeerHasCertificate(const grpc::AuthContext& context);

// A verified peer certificate as its auth context shows it: the subject common name
// ("x509_common_name") and the DNS and IP subject alternative names. Empty for a peer without one.
struct PeerCertificate {
  std::string common_name;
  std::vector<std::string> names;
};
PeerCertificate PeerCertificateOf(const grpc::AuthContext& context);

// True if `name`, a certificate's subject alternative name, names `host`, compared without case:
// equal, or a wildcard "*.REST" whose "*" stands for the whole first label of `host`, which must
// be non-empty ("*.svc" names "a.svc", not "svc" nor "a.b.svc"; never an IP address).
bool CertificateNameMatches(absl::string_view name, absl::string_view host);

// OK if `names` (a certificate's SANs) name the host of `address` ("host:port"), as
// CertificateNameMatches says; PERMISSION_DENIED naming both otherwise. This is the rule for a
// worker: its certificate must name the host it advertises (docs/security.md).
absl::Status CheckCertificateNamesHost(const std::vector<std::string>& names,
                                       absl::string_view address);

// OK if `certificate` vouches for a worker registering as `worker` and advertising `address`
// ("host:port"): its host is named by the certificate (CheckCertificateNamesHost), and the name is,
// without case, the certificate's common name, one of its subject alternative names, the first
// label of a DNS one ("w3" for "w3.example.com"), the first label of the advertised host, or the
// advertised address itself (a worker's default name). PERMISSION_DENIED naming what the
// certificate vouches for otherwise. The rule for a worker's registration under mTLS
// (docs/security.md): a member of the cluster cannot take another's name.
absl::Status CheckCertificateVouchesForWorker(const PeerCertificate& certificate,
                                              absl::string_view worker, absl::string_view address);

// Logs a daemon's certificate again when its files change on disk (gRPC's
// FileWatcherCertificateProvider then reloads them): a thread compares the modification times of
// options' three files every `interval` and, on a change, logs "TLS files changed (reloaded
// within the refresh interval): " + CheckTlsFiles's line (the new expiry), or the error that
// makes them unusable. Thread-safe; the destructor stops and joins the thread.
class CertificateWatcher {
 public:
  CertificateWatcher(TlsOptions options, absl::Duration interval,
                     std::function<void(const std::string&)> log);
  ~CertificateWatcher();
  CertificateWatcher(const CertificateWatcher&) = delete;
  CertificateWatcher& operator=(const CertificateWatcher&) = delete;

 private:
  // Polls until stopped; `seen` is the files' version at construction.
  void Run(std::string seen);

  const TlsOptions options_;
  const absl::Duration interval_;
  const std::function<void(const std::string&)> log_;
  absl::Mutex mu_;  // protects stop_.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain::net

#endif  // PIPETRAIN_COMMON_NET_TRANSPORT_SECURITY_H_
