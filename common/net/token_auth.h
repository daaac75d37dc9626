// Bearer tokens for the coordinator's client API: the token file the coordinator accepts
// (--auth-token-file), the token a client sends (--token-file or PIPETRAIN_TOKEN), and the
// grpc::AuthMetadataProcessor that checks every call before it reaches a handler.
//
// A client sends "authorization: Bearer <token>" (net::MakeChannelCredentials); the processor
// compares it with every accepted token in constant time and refuses a missing or wrong one with
// UNAUTHENTICATED, saying only that (never which tokens exist), and logs the refusal. Methods
// named as certificate-authenticated (the workers' Join, FetchState, PutState) need a verified
// client certificate instead of a token; open methods (the health check) need neither.
// docs/security.md.
#ifndef PIPETRAIN_COMMON_NET_TOKEN_AUTH_H_
#define PIPETRAIN_COMMON_NET_TOKEN_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::net {

// The environment variable a client reads its token from when no --token-file is given.
inline constexpr char kTokenEnvironmentVariable[] = "PIPETRAIN_TOKEN";

// Reads the tokens of a token file: one per line, surrounding white space ignored, blank lines
// and lines starting with '#' skipped. Errors: the file's read errors (NOT_FOUND, ...);
// INVALID_ARGUMENT naming the file and line for a token with white space or a non-printable
// character inside, or a file with no token.
absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path);

// The token a client sends: the first token of `token_file` if non-empty, else `environment`
// (the value of PIPETRAIN_TOKEN, empty if unset), else "" (send none). ReadTokenFile's errors.
absl::StatusOr<std::string> ResolveClientToken(const std::string& token_file,
                                               absl::string_view environment);

// True if `a` == `b`; the time taken depends only on the lengths (for comparing secrets).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// What the processor accepts.
struct TokenAuthOptions {
  // Tokens a client call may present. Empty: client calls need a verified client certificate.
  std::vector<std::string> tokens;
  // Full method names ("/pkg.Service/Method") that need a verified client certificate, no token.
  std::set<std::string> certificate_methods;
  // Full method names that need neither (e.g. the gRPC health check).
  std::set<std::string> open_methods;
  // Receives one line per refused call (thread-safe; may be null).
  std::function<void(const std::string&)> log;
};

// Checks every call of a TLS server (install with ServerCredentials::SetAuthMetadataProcessor).
// Non-blocking; thread-safe (its state is constant after construction).
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(TokenAuthOptions options);

  bool IsBlocking() const override { return false; }

  // OK, consuming the authorization header, for an open method, a certificate method called with
  // a verified certificate, or a client method with an accepted token (with tokens configured) or
  // a verified certificate (without). UNAUTHENTICATED otherwise.
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  // True if `token` is one of the accepted tokens; takes the same time whichever it matches.
  bool Accepts(absl::string_view token) const;

  const TokenAuthOptions options_;
  std::vector<std::string> token_digests_;  // SHA-256 of each accepted token.
};

}  // namespace pipetrain::net

#endif  // PIPETRAIN_COMMON_NET_TOKEN_AUTH_H_
