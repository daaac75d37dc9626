#include "common/net/transport_security.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/io/input_file.h"
#include "common/util/status_macros.h"

namespace pipetrain::net {
namespace {

// PEM files are small; anything larger is not one.
constexpr int64_t kMaxPemBytes = int64_t{1} << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

BioPtr MemoryBio(const std::string& bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

absl::StatusOr<std::string> ReadPem(absl::string_view what, const std::string& path) {
  return io::ReadInputFile(what, path, kMaxPemBytes, io::InputCompression::kNone);
}

absl::Time AsnTime(const ASN1_TIME* t) {
  struct tm tm {};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

std::string SubjectOf(X509* cert) {
  BioPtr out(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(out.get(), X509_get_subject_name(cert), 0,
                     XN_FLAG_ONELINE & ~ASN1_STRFLGS_ESC_MSB);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

std::vector<std::string> NamesOf(X509* cert) {
  std::vector<std::string> names;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans == nullptr) return names;
  for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
    if (name->type == GEN_DNS) {
      const unsigned char* data = ASN1_STRING_get0_data(name->d.dNSName);
      names.emplace_back(reinterpret_cast<const char*>(data),
                         static_cast<size_t>(ASN1_STRING_length(name->d.dNSName)));
    } else if (name->type == GEN_IPADD) {
      const int len = ASN1_STRING_length(name->d.iPAddress);
      const unsigned char* data = ASN1_STRING_get0_data(name->d.iPAddress);
      char text[INET6_ADDRSTRLEN] = {};
      if ((len == 4 && inet_ntop(AF_INET, data, text, sizeof(text)) != nullptr) ||
          (len == 16 && inet_ntop(AF_INET6, data, text, sizeof(text)) != nullptr)) {
        names.emplace_back(text);
      }
    }
  }
  GENERAL_NAMES_free(sans);
  return names;
}

absl::StatusOr<X509Ptr> ParseFirstCertificate(absl::string_view what, const std::string& path,
                                              const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' holds no PEM certificate"));
  }
  return cert;
}

// The host part of "host:port", "[v6]:port" or a bare host, without brackets.
absl::string_view HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) return address.substr(0, address.find(']'));
  const size_t colon = address.rfind(':');
  // A bare IPv6 address has several colons and no port.
  if (colon != absl::string_view::npos && address.find(':') == colon) {
    return address.substr(0, colon);
  }
  return address;
}

// True if `host` is an IPv4 or IPv6 address (not a DNS name).
bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

std::string FormatDay(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M UTC", t, absl::UTCTimeZone());
}

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(
    const TlsOptions& options) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(options.refresh_interval));
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file,
      static_cast<unsigned int>(std::min<int64_t>(seconds, 1 << 30)));
}

}  // namespace

absl::Status TlsOptions::Check(bool need_identity) const {
  if (!enabled()) return absl::OkStatus();
  if (ca_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls-ca (the CA certificate that signs the peers to accept)");
  }
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(cert_file.empty()
                                          ? "--tls-key needs --tls-cert (its certificate)"
                                          : "--tls-cert needs --tls-key (its private key)");
  }
  if (need_identity && cert_file.empty()) {
    return absl::InvalidArgumentError(
        "a daemon with TLS needs --tls-cert and --tls-key (its own certificate and key) besides "
        "--tls-ca");
  }
  if (refresh_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("TLS refresh interval must be >= 1s, got ",
                                                   absl::FormatDuration(refresh_interval)));
  }
  return absl::OkStatus();
}

absl::StatusOr<CertificateInfo> ReadCertificateInfo(const std::string& path) {
  PT_ASSIGN_OR_RETURN(const std::string pem, ReadPem("certificate", path));
  PT_ASSIGN_OR_RETURN(X509Ptr cert, ParseFirstCertificate("certificate", path, pem));
  CertificateInfo info;
  info.subject = SubjectOf(cert.get());
  info.not_before = AsnTime(X509_get0_notBefore(cert.get()));
  info.not_after = AsnTime(X509_get0_notAfter(cert.get()));
  info.names = NamesOf(cert.get());
  return info;
}

absl::StatusOr<std::string> CheckTlsFiles(const TlsOptions& options) {
  PT_RETURN_IF_ERROR(options.Check(/*need_identity=*/false));
  PT_ASSIGN_OR_RETURN(const std::string ca_pem, ReadPem("--tls-ca", options.ca_file));
  PT_RETURN_IF_ERROR(ParseFirstCertificate("--tls-ca", options.ca_file, ca_pem).status());
  std::string line = absl::StrCat("TLS: trusting the CA in ", options.ca_file);
  if (options.cert_file.empty()) return line;
  PT_ASSIGN_OR_RETURN(const std::string cert_pem, ReadPem("--tls-cert", options.cert_file));
  PT_ASSIGN_OR_RETURN(X509Ptr cert,
                      ParseFirstCertificate("--tls-cert", options.cert_file, cert_pem));
  PT_ASSIGN_OR_RETURN(const std::string key_pem, ReadPem("--tls-key", options.key_file));
  BioPtr key_bio = MemoryBio(key_pem);
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: '", options.key_file, "' holds no PEM private key (or it is encrypted)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls-key: '", options.key_file,
                                                   "' is not the key of the certificate in '",
                                                   options.cert_file, "'"));
  }
  const absl::Time now = absl::Now();
  const absl::Time not_before = AsnTime(X509_get0_notBefore(cert.get()));
  const absl::Time not_after = AsnTime(X509_get0_notAfter(cert.get()));
  const std::string subject = SubjectOf(cert.get());
  if (now >= not_after) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert: the certificate ", subject, " in '",
                                                   options.cert_file, "' expired on ",
                                                   FormatDay(not_after)));
  }
  if (now < not_before) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert: the certificate ", subject, " in '",
                                                   options.cert_file, "' is not valid before ",
                                                   FormatDay(not_before)));
  }
  const std::vector<std::string> names = NamesOf(cert.get());
  absl::StrAppend(&line, "; certificate ", subject, " (names ",
                  names.empty() ? "none" : absl::StrJoin(names, ", "), ") valid until ",
                  FormatDay(not_after), " (", (not_after - now) / absl::Hours(24), " days left)");
  return line;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options, ClientCertificate client_certificate) {
  if (!options.enabled()) return grpc::InsecureServerCredentials();
  PT_RETURN_IF_ERROR(options.Check(/*need_identity=*/true));
  PT_RETURN_IF_ERROR(CheckTlsFiles(options).status());
  grpc::experimental::TlsServerCredentialsOptions tls(Provider(options));
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(client_certificate == ClientCertificate::kRequired
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& options, const std::string& bearer_token) {
  if (!options.enabled()) {
    if (!bearer_token.empty()) {
      return absl::InvalidArgumentError(
          "a token is sent only over TLS: give --tls-ca (the CA of the coordinator's "
          "certificate)");
    }
    return grpc::InsecureChannelCredentials();
  }
  PT_RETURN_IF_ERROR(options.Check(/*need_identity=*/false));
  PT_RETURN_IF_ERROR(CheckTlsFiles(options).status());
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(Provider(options));
  tls.watch_root_certs();
  if (!options.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::experimental::TlsCredentials(tls);
  if (credentials == nullptr) {
    return absl::InternalError("gRPC refused the TLS channel options");
  }
  if (bearer_token.empty()) return credentials;
  return grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(bearer_token));
}

bool IsLoopbackAddress(absl::string_view address) {
  const std::string host = absl::AsciiStrToLower(HostOf(address));
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status CheckListenSecurity(absl::string_view flag, absl::string_view address, bool tls,
                                 bool insecure) {
  if (tls || insecure || IsLoopbackAddress(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve plaintext gRPC on ", flag, " ", address,
      ", which is not a loopback address: anyone who reaches it could join or drive the "
      "cluster. Give --tls-cert, --tls-key and --tls-ca (docs/security.md), listen on "
      "127.0.0.1, or pass --insecure to accept that risk"));
}

std::vector<std::string> PeerCertificateNames(const grpc::AuthContext& context) {
  std::vector<std::string> names;
  for (const grpc::string_ref& v : context.FindPropertyValues("x509_subject_alternative_name")) {
    names.emplace_back(v.data(), v.size());
  }
  return names;
}

bool PeerHasCertificate(const grpc::AuthContext& context) {
  return !context.FindPropertyValues("x509_pem_cert").empty();
}

PeerCertificate PeerCertificateOf(const grpc::AuthContext& context) {
  PeerCertificate certificate;
  const std::vector<grpc::string_ref> cn = context.FindPropertyValues("x509_common_name");
  if (!cn.empty()) certificate.common_name.assign(cn[0].data(), cn[0].size());
  certificate.names = PeerCertificateNames(context);
  return certificate;
}

bool CertificateNameMatches(absl::string_view name, absl::string_view host) {
  const std::string n = absl::AsciiStrToLower(name), h = absl::AsciiStrToLower(host);
  if (n == h) return true;
  absl::string_view rest = n;
  if (!absl::ConsumePrefix(&rest, "*.") || rest.empty() || IsIpAddress(h)) return false;
  const size_t dot = h.find('.');
  return dot != 0 && dot != std::string::npos && absl::string_view(h).substr(dot + 1) == rest;
}

absl::Status CheckCertificateNamesHost(const std::vector<std::string>& names,
                                       absl::string_view address) {
  const std::string host = absl::AsciiStrToLower(HostOf(address));
  for (const std::string& name : names) {
    if (CertificateNameMatches(name, host)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the peer's certificate names ", names.empty() ? "no host" : absl::StrJoin(names, ", "),
      ", not '", host, "' (the host it advertises in ", address,
      "): a worker's certificate must name its advertised host (docs/security.md)"));
}

absl::Status CheckCertificateVouchesForWorker(const PeerCertificate& certificate,
                                              absl::string_view worker, absl::string_view address) {
  PT_RETURN_IF_ERROR(CheckCertificateNamesHost(certificate.names, address));
  const std::string name = absl::AsciiStrToLower(worker);
  const std::string host = absl::AsciiStrToLower(HostOf(address));
  // What the certificate vouches for; the advertised host is one of its names (checked above).
  std::vector<std::string> vouched = {absl::AsciiStrToLower(certificate.common_name),
                                      absl::AsciiStrToLower(address)};
  for (const std::string& san : certificate.names) vouched.push_back(absl::AsciiStrToLower(san));
  vouched.push_back(host);
  for (size_t i = 2, n = vouched.size(); i < n; ++i) {
    const std::string& dns = vouched[i];
    if (!IsIpAddress(dns) && !absl::StartsWith(dns, "*") && dns.find('.') != std::string::npos) {
      vouched.push_back(dns.substr(0, dns.find('.')));
    }
  }
  if (!name.empty() && std::find(vouched.begin(), vouched.end(), name) != vouched.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the peer's certificate (CN ",
      certificate.common_name.empty() ? "none" : "'" + certificate.common_name + "'", "; names ",
      certificate.names.empty() ? "none" : absl::StrJoin(certificate.names, ", "),
      ") does not vouch for the name '", worker,
      "': a worker must register under its certificate's common name, one of its subject "
      "alternative names or the first label of a DNS one, or the first label of the host it "
      "advertises (docs/security.md)"));
}

namespace {

// The modification times of the files of `options`, as text ("" for a file that is missing).
std::string FilesVersion(const TlsOptions& options) {
  std::string version;
  for (const std::string* path : {&options.cert_file, &options.key_file, &options.ca_file}) {
    struct stat st {};
    if (!path->empty() && stat(path->c_str(), &st) == 0) {
      absl::StrAppend(&version, st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "/", st.st_size);
    }
    version.push_back(';');
  }
  return version;
}

}  // namespace

CertificateWatcher::CertificateWatcher(TlsOptions options, absl::Duration interval,
                                       std::function<void(const std::string&)> log)
    : options_(std::move(options)), interval_(interval), log_(std::move(log)) {
  // The version seen at construction, so that a change right after it is not missed.
  thread_ = std::thread([this, seen = FilesVersion(options_)] { Run(seen); });
}

CertificateWatcher::~CertificateWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void CertificateWatcher::Run(std::string seen) {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_)) {
    const std::string now = FilesVersion(options_);
    if (now == seen) continue;
    seen = now;
    absl::StatusOr<std::string> line = CheckTlsFiles(options_);
    log_(line.ok()
             ? absl::StrCat("TLS files changed (reloaded within the refresh interval): ", *line)
             : absl::StrCat("TLS files changed and are not usable (the previous ones stay "
                            "in use): ",
                            line.status().message()));
  }
}

}  // namespace pipetrain::net
