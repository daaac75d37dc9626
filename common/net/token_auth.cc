#include "common/net/token_auth.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

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

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path) {
  PT_ASSIGN_OR_RETURN(
      const std::string text,
      io::ReadInputFile("token file", path, kMaxTokenFileBytes, io::InputCompression::kNone));
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    for (const char c : line) {
      if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(
            absl::StrCat("token file '", path, "' line ", line_number,
                         ": a token is printable ASCII without white space (one token per line)"));
      }
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' holds no token"));
  }
  return tokens;
}

absl::StatusOr<std::string> ResolveClientToken(const std::string& token_file,
                                               absl::string_view environment) {
  if (!token_file.empty()) {
    PT_ASSIGN_OR_RETURN(std::vector<std::string> tokens, ReadTokenFile(token_file));
    return std::move(tokens.front());
  }
  return std::string(absl::StripAsciiWhitespace(environment));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

TokenAuthProcessor::TokenAuthProcessor(TokenAuthOptions options) : options_(std::move(options)) {
  for (const std::string& token : options_.tokens) token_digests_.push_back(DigestOf(token));
}

bool TokenAuthProcessor::Accepts(absl::string_view token) const {
  // Digests have one length whatever the token's, and every accepted token is compared.
  const std::string digest = DigestOf(token);
  bool match = false;
  for (const std::string& accepted : token_digests_) {
    const bool same = !digest.empty() && ConstantTimeEquals(accepted, digest);
    match = match || same;
  }
  return match;
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
  if (options_.open_methods.count(method) != 0) return grpc::Status::OK;
  if (options_.certificate_methods.count(method) != 0) {
    if (has_certificate) return grpc::Status::OK;
    return refuse(absl::StrCat(method,
                               " is a worker call: it needs a client certificate signed by the "
                               "cluster's CA"));
  }
  if (options_.tokens.empty()) {
    if (has_certificate) return grpc::Status::OK;
    return refuse(
        "this coordinator accepts clients with a certificate signed by its CA "
        "(--tls-cert/--tls-key)");
  }
  auto it = auth_metadata.find(kAuthorization);
  if (it == auth_metadata.end()) {
    return refuse(
        "missing token: send 'authorization: Bearer <token>' (pipetrain: --token-file or "
        "PIPETRAIN_TOKEN)");
  }
  const std::string header = Value(it->second);
  absl::string_view token = header;
  if (!absl::ConsumePrefix(&token, kBearerPrefix) || !Accepts(token)) {
    return refuse("invalid token");
  }
  consumed_auth_metadata->insert({kAuthorization, header});
  return grpc::Status::OK;
}

}  // namespace pipetrain::net
