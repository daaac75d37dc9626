#include "common/net/token_auth.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/io/digest.h"
#include "common/io/input_file.h"
#include "common/net/transport_security.h"
#include "common/util/status_macros.h"

namespace pipetrain::net {
namespace {

constexpr int64_t kMaxTokenFileBytes = int64_t{1} << 20;
constexpr char kAuthorization[] = "authorization";
constexpr char kBearerPrefix[] = "Bearer ";

// SHA-256 hex of `bytes` ("" only if OpenSSL fails, which then matches nothing).
std::string DigestOf(absl::string_view bytes) {
  absl::StatusOr<io::FileDigest> d = io::DigestBytes(bytes);
  return d.ok() ? d->sha256 : std::string();
}

std::string Value(const grpc::string_ref& s) { return std::string(s.data(), s.size()); }

// What tells a change of the file at `path`: its size and modification time ("" if it cannot be
// stat'ed).
std::string FileStamp(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_ino);
}

}  // namespace

namespace {

// NAME of a "NAME:TOKEN" line: 1 to 64 of [A-Za-z0-9._-].
bool IsPrincipalName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// One line of a token file (stripped, not a comment): its principal and token, or why not.
absl::StatusOr<ClientToken> ParseTokenLine(absl::string_view line) {
  for (const char c : line) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          "a token is printable ASCII without white space (one token per line)");
    }
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return ClientToken{kAdminPrincipal, std::string(line)};
  ClientToken t{std::string(line.substr(0, colon)), std::string(line.substr(colon + 1))};
  if (!IsPrincipalName(t.principal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", t.principal,
                     "' is not a principal name (NAME:TOKEN, NAME of 1 to 64 letters, digits, "
                     "'.', '_' or '-')"));
  }
  if (t.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("principal '", t.principal, "' has no token"));
  }
  return t;
}

}  // namespace

absl::StatusOr<std::vector<ClientToken>> ReadTokenFile(const std::string& path) {
  PT_ASSIGN_OR_RETURN(
      const std::string text,
      io::ReadInputFile("token file", path, kMaxTokenFileBytes, io::InputCompression::kNone));
  std::vector<ClientToken> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    const std::string where = absl::StrCat("token file '", path, "' line ", line_number, ": ");
    absl::StatusOr<ClientToken> token = ParseTokenLine(line);
    if (!token.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, token.status().message()));
    for (const ClientToken& earlier : tokens) {
      if (earlier.token == token->token) {
        return absl::InvalidArgumentError(absl::StrCat(where, "a token given twice"));
      }
    }
    tokens.push_back(*std::move(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' holds no token"));
  }
  return tokens;
}

absl::StatusOr<std::string> ResolveClientToken(const std::string& token_file,
                                               absl::string_view environment) {
  if (!token_file.empty()) {
    PT_ASSIGN_OR_RETURN(std::vector<ClientToken> tokens, ReadTokenFile(token_file));
    return std::move(tokens.front().token);
  }
  return std::string(absl::StripAsciiWhitespace(environment));
}

std::string ServiceOfMethod(absl::string_view method) {
  if (!absl::ConsumePrefix(&method, "/")) return "";
  const size_t slash = method.find('/');
  if (slash == absl::string_view::npos || slash == 0 || slash + 1 == method.size() ||
      method.find('/', slash + 1) != absl::string_view::npos) {
    return "";
  }
  return std::string(method.substr(0, slash));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

TokenAuthProcessor::TokenAuthProcessor(TokenAuthOptions options)
    : options_(std::move(options)), token_mode_(!options_.tokens.empty()) {
  for (const ClientToken& t : options_.tokens)
    accepted_.push_back({DigestOf(t.token), t.principal});
}

absl::Status TokenAuthProcessor::SetTokens(const std::vector<ClientToken>& tokens) {
  if (tokens.empty() || !token_mode_) {
    return absl::InvalidArgumentError(
        "the token list can be replaced only by another non-empty one (a coordinator started "
        "without tokens keeps taking client certificates)");
  }
  std::vector<Accepted> accepted;
  for (const ClientToken& t : tokens) accepted.push_back({DigestOf(t.token), t.principal});
  absl::MutexLock lock(&mu_);
  accepted_ = std::move(accepted);
  return absl::OkStatus();
}

std::optional<std::string> TokenAuthProcessor::Accepts(absl::string_view token) const {
  // Compare digests (fixed length) with every accepted one, without stopping at a match.
  const std::string digest = DigestOf(token);
  std::optional<std::string> principal;
  absl::MutexLock lock(&mu_);
  for (const Accepted& a : accepted_) {
    const bool match = !digest.empty() && ConstantTimeEquals(digest, a.digest);
    if (match && !principal.has_value()) principal = a.principal;
  }
  return principal;
}

absl::StatusOr<std::string> TokenAuthProcessor::ClientPrincipal(
    const InputMetadata& auth_metadata, const grpc::AuthContext* context, bool has_certificate,
    OutputMetadata* consumed_auth_metadata) const {
  if (!token_mode_) {
    if (!has_certificate) {
      return absl::UnauthenticatedError(
          "this coordinator accepts clients with a certificate signed by its CA "
          "(--tls-cert/--tls-key)");
    }
    const std::vector<grpc::string_ref> cn = context->FindPropertyValues("x509_common_name");
    return cn.empty() ? std::string() : Value(cn.front());
  }
  auto it = auth_metadata.find(kAuthorization);
  if (it == auth_metadata.end()) {
    return absl::UnauthenticatedError(
        "missing token: send 'authorization: Bearer <token>' (pipetrain: --token-file or "
        "PIPETRAIN_TOKEN)");
  }
  const std::string header = Value(it->second);
  absl::string_view token = header;
  std::optional<std::string> principal;
  if (absl::ConsumePrefix(&token, kBearerPrefix)) principal = Accepts(token);
  if (!principal.has_value()) return absl::UnauthenticatedError("invalid token");
  consumed_auth_metadata->insert({kAuthorization, header});
  return *principal;
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata,
                                         OutputMetadata* /*response_metadata*/) {
  std::string method;
  if (auto it = auth_metadata.find(":path"); it != auth_metadata.end()) method = Value(it->second);
  const bool has_certificate = context != nullptr && PeerHasCertificate(*context);
  auto refuse = [&](const std::string& why) {
    if (options_.log) {
      std::string who = "a peer without a certificate";
      if (has_certificate) {
        const std::vector<grpc::string_ref> cn = context->FindPropertyValues("x509_common_name");
        who = absl::StrCat("certificate CN=", cn.empty() ? "?" : Value(cn.front()));
      }
      options_.log(
          absl::StrCat("refused ", method.empty() ? "a call" : method, " from ", who, ": ", why));
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
  };
  const std::string service = ServiceOfMethod(method);
  if (options_.open_services.count(service) != 0) return grpc::Status::OK;
  if (options_.certificate_services.count(service) != 0) {
    if (has_certificate) return grpc::Status::OK;
    return refuse(absl::StrCat(method, " is a worker call (", service,
                               "): it needs a client certificate signed by the cluster's CA"));
  }
  absl::StatusOr<std::string> principal =
      ClientPrincipal(auth_metadata, context, has_certificate, consumed_auth_metadata);
  if (!principal.ok()) return refuse(std::string(principal.status().message()));
  if (context != nullptr) context->AddProperty(kPrincipalProperty, *principal);
  return grpc::Status::OK;
}

TokenFileWatcher::TokenFileWatcher(std::string path, absl::Duration interval,
                                   std::shared_ptr<TokenAuthProcessor> processor,
                                   std::function<void(const std::string&)> log)
    : path_(std::move(path)),
      interval_(interval),
      processor_(std::move(processor)),
      log_(std::move(log)),
      stamp_(FileStamp(path_)),
      thread_([this] { Loop(); }) {}

TokenFileWatcher::~TokenFileWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void TokenFileWatcher::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_)) return;
    }
    CheckNow();
  }
}

void TokenFileWatcher::CheckNow() {
  const std::string stamp = FileStamp(path_);
  {
    absl::MutexLock lock(&mu_);
    if (stamp == stamp_) return;
    stamp_ = stamp;
  }
  absl::StatusOr<std::vector<ClientToken>> tokens = ReadTokenFile(path_);
  absl::Status set = tokens.ok() ? processor_->SetTokens(*tokens) : tokens.status();
  if (!log_) return;
  if (!set.ok()) {
    log_(absl::StrCat("token file ", path_, " changed but cannot be used (", set.message(),
                      "); the previous tokens stay"));
    return;
  }
  std::set<std::string> principals;
  for (const ClientToken& t : *tokens) principals.insert(t.principal);
  log_(absl::StrCat("token file ", path_, " reloaded: ", tokens->size(), " token(s) of ",
                    principals.size(), " principal(s)"));
}

}  // namespace pipetrain::net
