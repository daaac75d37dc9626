// Bearer tokens for the coordinator's client API: the token file the coordinator accepts
// (--auth-token-file), the token a client sends (--token-file or PIPETRAIN_TOKEN), and the
// grpc::AuthMetadataProcessor that checks every call before it reaches a handler.
//
// A client sends "authorization: Bearer <token>" (net::MakeChannelCredentials); the processor
// compares it with every accepted token in constant time and refuses a missing or wrong one with
// UNAUTHENTICATED, saying only that (never which tokens exist), and logs the refusal. It decides
// by service, not by method: a certificate-authenticated service (the workers' WorkerControl)
// needs a verified client certificate instead of a token; an open service (the health check)
// needs neither; every other service is a client's.
// docs/security.md.
#ifndef PIPETRAIN_COMMON_NET_TOKEN_AUTH_H_
#define PIPETRAIN_COMMON_NET_TOKEN_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/net/principal.h"

namespace pipetrain::net {

// The environment variable a client reads its token from when no --token-file is given.
inline constexpr char kTokenEnvironmentVariable[] = "PIPETRAIN_TOKEN";

// One accepted client token and the principal it authenticates as.
struct ClientToken {
  std::string principal;
  std::string token;
};

// Reads a token file: one "NAME:TOKEN" per line (NAME: 1 to 64 of [A-Za-z0-9._-]; several
// tokens may share a name); a line without ':' is a bare token of the principal "admin" (a token
// file written before principals existed keeps its meaning: every token sees every job).
// Surrounding white space is ignored, blank lines and lines starting with '#' are skipped.
// Errors: the file's read errors (NOT_FOUND, ...); INVALID_ARGUMENT naming the file and line for
// a token with white space or a non-printable character inside, a bad name, an empty token, a
// token given twice, or a file with no token.
absl::StatusOr<std::vector<ClientToken>> ReadTokenFile(const std::string& path);

// The token a client sends: the token of the first line of `token_file` if non-empty (its
// "NAME:" dropped), else `environment` (the value of PIPETRAIN_TOKEN, empty if unset), else ""
// (send none). ReadTokenFile's errors.
absl::StatusOr<std::string> ResolveClientToken(const std::string& token_file,
                                               absl::string_view environment);

// The service of a full method name: "pkg.Service" for "/pkg.Service/Method"; "" if `method` is
// not of that form.
std::string ServiceOfMethod(absl::string_view method);

// True if `a` == `b`; the time taken depends only on the lengths (for comparing secrets).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// What the processor accepts.
struct TokenAuthOptions {
  // Tokens a client call may present, with their principals. Empty: client calls need a
  // verified client certificate, and act as its common name.
  std::vector<ClientToken> tokens;
  // Full service names ("pkg.Service") whose every method needs a verified client certificate,
  // no token (the workers' pipetrain.v1.WorkerControl).
  std::set<std::string> certificate_services;
  // Full service names whose methods need neither (e.g. grpc.health.v1.Health).
  std::set<std::string> open_services;
  // Receives one line per refused call (thread-safe; may be null).
  std::function<void(const std::string&)> log;
};

// Checks every call of a TLS server (install with ServerCredentials::SetAuthMetadataProcessor)
// and records the principal of an accepted client call as the AuthContext property
// kPrincipalProperty. Non-blocking; thread-safe; the tokens can be replaced while it serves
// (SetTokens: a reloaded token file).
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(TokenAuthOptions options);

  bool IsBlocking() const override { return false; }

  // OK, consuming the authorization header, for a method of an open service, of a certificate
  // service called with a verified certificate, or of any other service with an accepted token
  // (with tokens configured: the call's principal is the token's) or a verified certificate
  // (without: the certificate's common name). UNAUTHENTICATED otherwise.
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // Replaces the accepted tokens (an empty list is refused: it would switch client calls to
  // certificates). Calls already accepted keep their principal.
  absl::Status SetTokens(const std::vector<ClientToken>& tokens) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The principal of `token` if it is accepted; takes the same time whichever token it matches.
  std::optional<std::string> Accepts(absl::string_view token) const ABSL_LOCKS_EXCLUDED(mu_);
  // Checks a client call (not of an open or certificate service): its principal, or why not.
  absl::StatusOr<std::string> ClientPrincipal(const InputMetadata& auth_metadata,
                                              const grpc::AuthContext* context,
                                              bool has_certificate,
                                              OutputMetadata* consumed_auth_metadata) const;

  const TokenAuthOptions options_;  // its `tokens` only as given at construction.
  const bool token_mode_;           // tokens were configured.
  struct Accepted {
    std::string digest;  // SHA-256 of the token.
    std::string principal;
  };
  mutable absl::Mutex mu_;  // protects the accepted tokens.
  std::vector<Accepted> accepted_ ABSL_GUARDED_BY(mu_);
};

// Re-reads a token file when it changes (its size or modification time), every `interval`, and
// gives the processor its tokens; a file that no longer reads (or holds no token) is logged and
// the previous tokens stay. Stops (joins its thread) when destroyed.
class TokenFileWatcher {
 public:
  TokenFileWatcher(std::string path, absl::Duration interval,
                   std::shared_ptr<TokenAuthProcessor> processor,
                   std::function<void(const std::string&)> log);
  ~TokenFileWatcher();
  TokenFileWatcher(const TokenFileWatcher&) = delete;
  TokenFileWatcher& operator=(const TokenFileWatcher&) = delete;

  // Checks the file now (tests; the thread does it every interval). Thread-safe.
  void CheckNow() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const std::string path_;
  const absl::Duration interval_;
  const std::shared_ptr<TokenAuthProcessor> processor_;
  const std::function<void(const std::string&)> log_;
  absl::Mutex mu_;  // protects the stamp of the file last read and the stop flag.
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist.
};

}  // namespace pipetrain::net

#endif  // PIPETRAIN_COMMON_NET_TOKEN_AUTH_H_
