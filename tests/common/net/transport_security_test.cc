// Transport security: TLS option and file checks (with a test CA made by
// scripts/make_test_certs.sh), the secure-by-default listen rule, certificate names, and real
// gRPC calls over mTLS on 127.0.0.1 — a client without a certificate, or with one from another CA,
// is refused; the server sees the client's certificate names; tokens are checked per call.
#include "common/net/transport_security.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/net/token_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/net/test_certs.h"

namespace pipetrain::net {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TransportSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new std::string(testing::MakeTestCerts()); }
  static void TearDownTestSuite() {
    std::system(absl::StrCat("rm -rf '", *certs_, "'").c_str());
    delete certs_;
  }
  void SetUp() override { ASSERT_FALSE(certs_->empty()) << "scripts/make_test_certs.sh failed"; }

  // The options of `name` (coordinator, worker-0, client, other-worker, ...) trusting `ca`.
  static TlsOptions Identity(const std::string& name, const std::string& ca = "ca") {
    TlsOptions o;
    o.cert_file = absl::StrCat(*certs_, "/", name, ".pem");
    o.key_file = absl::StrCat(*certs_, "/", name, ".key");
    o.ca_file = absl::StrCat(*certs_, "/", ca, ".pem");
    return o;
  }
  static std::string Path(const std::string& file) { return absl::StrCat(*certs_, "/", file); }

  static std::string* certs_;
};
std::string* TransportSecurityTest::certs_ = nullptr;

TEST_F(TransportSecurityTest, OptionsNeedTheCaAndCertWithKey) {
  EXPECT_TRUE(TlsOptions().Check(true).ok());  // plaintext
  TlsOptions o = Identity("coordinator");
  EXPECT_TRUE(o.Check(true).ok());
  o.ca_file.clear();
  EXPECT_THAT(o.Check(true).message(), HasSubstr("--tls-ca"));
  o = Identity("coordinator");
  o.key_file.clear();
  EXPECT_EQ(o.Check(false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.Check(false).message(), HasSubstr("--tls-key"));
  TlsOptions ca_only;
  ca_only.ca_file = Path("ca.pem");
  EXPECT_TRUE(ca_only.Check(false).ok());  // a client without a certificate
  EXPECT_EQ(ca_only.Check(true).code(), absl::StatusCode::kInvalidArgument);  // not a daemon
}

TEST_F(TransportSecurityTest, CheckTlsFilesReportsExpiryAndRefusesMismatchedOrMissingFiles) {
  absl::StatusOr<std::string> line = CheckTlsFiles(Identity("worker-0"));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("CN = worker-0"));
  EXPECT_THAT(*line, HasSubstr("valid until"));
  EXPECT_THAT(*line, HasSubstr("days left"));
  TlsOptions mismatched = Identity("worker-0");
  mismatched.key_file = Path("worker-1.key");
  const absl::Status bad = CheckTlsFiles(mismatched).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("is not the key of the certificate"));
  TlsOptions missing = Identity("worker-0");
  missing.ca_file = Path("no-such.pem");
  EXPECT_EQ(CheckTlsFiles(missing).status().code(), absl::StatusCode::kNotFound);
  TlsOptions not_pem = Identity("worker-0");
  not_pem.cert_file = Path("tokens");
  EXPECT_THAT(CheckTlsFiles(not_pem).status().message(), HasSubstr("holds no PEM certificate"));
  EXPECT_EQ(MakeServerCredentials(mismatched).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TransportSecurityTest, CertificateNames) {
  absl::StatusOr<CertificateInfo> worker = ReadCertificateInfo(Path("worker-0.pem"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_THAT(worker->names, ElementsAre("127.0.0.1", "localhost"));
  EXPECT_LT(worker->not_before, worker->not_after);
  absl::StatusOr<CertificateInfo> client = ReadCertificateInfo(Path("client.pem"));
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(client->names.empty());
  EXPECT_TRUE(CheckCertificateNamesHost(worker->names, "127.0.0.1:7100").ok());
  EXPECT_TRUE(CheckCertificateNamesHost(worker->names, "LOCALHOST:7100").ok());
  const absl::Status other = CheckCertificateNamesHost(worker->names, "10.0.0.9:7100");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("names 127.0.0.1, localhost, not '10.0.0.9'"));
  EXPECT_EQ(CheckCertificateNamesHost(client->names, "127.0.0.1:1").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(TransportSecurityTest, WatcherLogsTheNewCertificateWhenItsFilesChange) {
  const std::string dir = ::testing::TempDir() + "/watched";
  ASSERT_EQ(
      std::system(absl::StrCat("mkdir -p '", dir, "' && cp '", Path("worker-0.pem"), "' '", dir,
                               "/cert.pem' && cp '", Path("worker-0.key"), "' '", dir, "/cert.key'")
                      .c_str()),
      0);
  TlsOptions watched;
  watched.cert_file = dir + "/cert.pem";
  watched.key_file = dir + "/cert.key";
  watched.ca_file = Path("ca.pem");
  absl::Mutex mu;
  std::vector<std::string> lines;
  {
    CertificateWatcher watcher(watched, absl::Milliseconds(20), [&](const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.push_back(line);
    });
    // Replaced by worker-1's certificate and key, renamed into place (a new inode and mtime).
    ASSERT_EQ(
        std::system(absl::StrCat("cp '", Path("worker-1.key"), "' '", dir, "/k' && cp '",
                                 Path("worker-1.pem"), "' '", dir, "/c' && touch -d '+1 min' '",
                                 dir, "/k' '", dir, "/c' && mv '", dir, "/k' '", dir,
                                 "/cert.key' && mv '", dir, "/c' '", dir, "/cert.pem'")
                        .c_str()),
        0);
    absl::MutexLock lock(&mu);
    auto logged = [&lines]() {
      return !lines.empty() && absl::StrContains(lines.back(), "CN = worker-1");
    };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&logged), absl::Seconds(10)));
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr("TLS files changed (reloaded within the refresh interval)"));
  EXPECT_THAT(lines.back(), HasSubstr("days left"));
}

TEST(ListenSecurityTest, NonLoopbackNeedsTlsOrInsecure) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.2.1:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("198.18.0.2:7070"));
  EXPECT_FALSE(IsLoopbackAddress("127example.com:1"));
  EXPECT_TRUE(CheckListenSecurity("--listen", "127.0.0.1:0", false, false).ok());
  EXPECT_TRUE(CheckListenSecurity("--listen", "0.0.0.0:0", true, false).ok());
  EXPECT_TRUE(CheckListenSecurity("--listen", "0.0.0.0:0", false, true).ok());
  const absl::Status refused = CheckListenSecurity("--listen", "0.0.0.0:7070", false, false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              HasSubstr("refusing to serve plaintext gRPC on --listen 0.0.0.0:7070"));
  EXPECT_THAT(refused.message(), HasSubstr("--insecure"));
}

TEST(TokenFileTest, OneTokenPerLine) {
  const std::string path = ::testing::TempDir() + "/tokens";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("# comment\n  first-token  \n\nsecond\n", f);
    std::fclose(f);
  }
  absl::StatusOr<std::vector<ClientToken>> tokens = ReadTokenFile(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  // Bare tokens (a file written before principals) are admin's.
  EXPECT_EQ((*tokens)[0].token, "first-token");
  EXPECT_EQ((*tokens)[0].principal, "admin");
  EXPECT_EQ((*tokens)[1].token, "second");
  absl::StatusOr<std::string> token = ResolveClientToken(path, "from-env");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "first-token");
  EXPECT_EQ(*ResolveClientToken("", " from-env\n"), "from-env");
  EXPECT_EQ(*ResolveClientToken("", ""), "");
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("two words\n", f);
    std::fclose(f);
  }
  EXPECT_THAT(ReadTokenFile(path).status().message(), HasSubstr("line 1"));
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("# nothing\n", f);
    std::fclose(f);
  }
  EXPECT_THAT(ReadTokenFile(path).status().message(), HasSubstr("holds no token"));
  EXPECT_EQ(ReadTokenFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenFileTest, NamedLinesGiveEachTokenItsPrincipal) {
  const std::string path = ::testing::TempDir() + "/named-tokens";
  auto write = [&](const char* text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  write("alice:a-1\nalice:a-2\nbob.ci_2-x:b:with:colons\n");
  absl::StatusOr<std::vector<ClientToken>> tokens = ReadTokenFile(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[0].principal, "alice");
  EXPECT_EQ((*tokens)[1].token, "a-2");
  EXPECT_EQ((*tokens)[2].principal, "bob.ci_2-x");
  EXPECT_EQ((*tokens)[2].token, "b:with:colons");
  // A client's token file may hold its line as the coordinator's does: it sends the token.
  EXPECT_EQ(*ResolveClientToken(path, ""), "a-1");
  write("alice:same\nbob:same\n");
  EXPECT_THAT(ReadTokenFile(path).status().message(), HasSubstr("line 2: a token given twice"));
  write("al/ice:x\n");
  EXPECT_THAT(ReadTokenFile(path).status().message(), HasSubstr("not a principal name"));
  write("alice:\n");
  EXPECT_THAT(ReadTokenFile(path).status().message(), HasSubstr("principal 'alice' has no token"));
  write(":tok\n");
  EXPECT_EQ(ReadTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
}

// A wildcard names one whole first label of a DNS name, never an IP address (RFC 6125).
TEST(CertificateNameTest, WildcardsStandForOneWholeFirstLabel) {
  EXPECT_TRUE(CertificateNameMatches("w1.example", "W1.Example"));
  EXPECT_TRUE(CertificateNameMatches("*.pipetrain-worker.ns.svc",
                                     "pipetrain-worker-3.pipetrain-worker.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches("*.pipetrain-worker.ns.svc", "pipetrain-worker.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches("*.ns.svc", "a.pipetrain-worker.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches("*.ns.svc", ".ns.svc"));
  EXPECT_FALSE(CertificateNameMatches("w*.example", "w1.example"));
  EXPECT_FALSE(CertificateNameMatches("*.0.0.1", "127.0.0.1"));
  EXPECT_FALSE(CertificateNameMatches("*", "localhost"));
  const std::vector<std::string> wildcard = {"*.pipetrain-worker.ns.svc"};
  EXPECT_TRUE(
      CheckCertificateNamesHost(wildcard, "pipetrain-worker-0.pipetrain-worker.ns.svc:7100").ok());
  EXPECT_EQ(CheckCertificateNamesHost(wildcard, "pipetrain-coordinator.ns.svc:7100").code(),
            absl::StatusCode::kPermissionDenied);
}

// With mTLS a worker registers only under a name its certificate vouches for (issue 34: another
// member's certificate, e.g. the coordinator's, took a worker's name and locked it out).
TEST(CertificateNameTest, AWorkersNameMustBeOneItsCertificateVouchesFor) {
  const PeerCertificate worker{"worker-0", {"127.0.0.1", "localhost", "w0.example.com"}};
  for (const char* name : {"worker-0", "WORKER-0", "w0.example.com", "w0", "localhost", "127.0.0.1",
                           "127.0.0.1:7100"}) {
    EXPECT_TRUE(CheckCertificateVouchesForWorker(worker, name, "127.0.0.1:7100").ok()) << name;
  }
  const PeerCertificate coordinator{"coordinator", {"127.0.0.1", "localhost"}};
  const absl::Status taken =
      CheckCertificateVouchesForWorker(coordinator, "worker-0", "127.0.0.1:7100");
  EXPECT_EQ(taken.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(taken.message(),
              HasSubstr("the peer's certificate (CN 'coordinator'; names 127.0.0.1, localhost) "
                        "does not vouch for the name 'worker-0': a worker must register under"));
  // Neither the first label of an IP address, nor an empty name, nor a name of another host.
  EXPECT_FALSE(CheckCertificateVouchesForWorker(worker, "127", "127.0.0.1:7100").ok());
  EXPECT_FALSE(CheckCertificateVouchesForWorker(worker, "", "127.0.0.1:7100").ok());
  EXPECT_FALSE(CheckCertificateVouchesForWorker(worker, "127.0.0.1:7101", "127.0.0.1:7100").ok());
  // The host rule still comes first.
  EXPECT_THAT(CheckCertificateVouchesForWorker(worker, "worker-0", "10.0.0.9:7100").message(),
              HasSubstr("not '10.0.0.9'"));
  // A StatefulSet's pods sharing one wildcard certificate: each pod's name is the first label of
  // the host it advertises; the name of a pod under another service is not.
  const PeerCertificate pods{"pipetrain", {"*.pipetrain-worker.ns.svc"}};
  EXPECT_TRUE(CheckCertificateVouchesForWorker(pods, "pipetrain-worker-3",
                                               "pipetrain-worker-3.pipetrain-worker.ns.svc:7100")
                  .ok());
  EXPECT_FALSE(CheckCertificateVouchesForWorker(pods, "pipetrain-worker-4",
                                                "pipetrain-worker-3.pipetrain-worker.ns.svc:7100")
                   .ok());
  // A certificate without names (a client's) cannot register at all.
  const PeerCertificate client{"client", {}};
  EXPECT_FALSE(CheckCertificateVouchesForWorker(client, "client", "127.0.0.1:7100").ok());
}

// A TLS server whose every call ends OK and records the caller's certificate.
class EchoService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    {
      absl::MutexLock lock(&mu_);
      peer_ = ctx->auth_context() ? PeerCertificateOf(*ctx->auth_context()) : PeerCertificate();
    }
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
  std::vector<std::string> names() {
    absl::MutexLock lock(&mu_);
    return peer_.names;
  }
  std::string common_name() {
    absl::MutexLock lock(&mu_);
    return peer_.common_name;
  }

 private:
  absl::Mutex mu_;
  PeerCertificate peer_ ABSL_GUARDED_BY(mu_);
};

class TlsCallTest : public TransportSecurityTest {
 protected:
  // Starts the server with `server` credentials, certificate policy and processor options.
  void Serve(const TlsOptions& server, ClientCertificate policy,
             std::optional<TokenAuthOptions> auth = std::nullopt) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        MakeServerCredentials(server, policy);
    ASSERT_TRUE(creds.ok()) << creds.status();
    if (auth.has_value()) {
      auth->log = [this](const std::string& line) {
        absl::MutexLock lock(&log_mu_);
        log_.push_back(line);
      };
      (*creds)->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(*auth));
    }
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  // One unary call of `method` with `client` credentials (10 s deadline).
  grpc::Status Call(const TlsOptions& client, const std::string& method,
                    const std::string& token = "") {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(client, token);
    if (!creds.ok())
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(creds.status().message()));
    grpc::GenericStub stub(grpc::CreateChannel(address_, *creds));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice payload(std::string("x"));
    grpc::ByteBuffer request(&payload, 1), response;
    grpc::Status result;
    absl::Notification done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      result = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return result;
  }

  std::vector<std::string> log() {
    absl::MutexLock lock(&log_mu_);
    return log_;
  }

  EchoService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  absl::Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
};

TEST_F(TlsCallTest, MutualTlsAcceptsOnlyCertificatesOfTheCa) {
  Serve(Identity("coordinator"), ClientCertificate::kRequired);
  EXPECT_TRUE(Call(Identity("worker-0"), "/x.Y/Z").ok());
  EXPECT_THAT(service_.names(), ElementsAre("127.0.0.1", "localhost"));
  EXPECT_EQ(service_.common_name(), "worker-0");
  TlsOptions no_certificate;
  no_certificate.ca_file = Path("ca.pem");
  EXPECT_EQ(Call(no_certificate, "/x.Y/Z").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(Identity("other-worker", "ca"), "/x.Y/Z").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA refuses this server.
  EXPECT_EQ(Call(Identity("other-worker", "other-ca"), "/x.Y/Z").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Plaintext to a TLS port fails.
  EXPECT_EQ(Call(TlsOptions(), "/x.Y/Z").error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsCallTest, TheServerMustNameTheHostDialled) {
  Serve(Identity("worker-wronghost"), ClientCertificate::kRequired);
  EXPECT_EQ(Call(Identity("worker-0"), "/x.Y/Z").error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(ServiceOfMethodTest, TakesTheServiceOfAFullMethodName) {
  EXPECT_EQ(ServiceOfMethod("/pipetrain.v1.WorkerControl/Join"), "pipetrain.v1.WorkerControl");
  EXPECT_EQ(ServiceOfMethod("/grpc.health.v1.Health/Check"), "grpc.health.v1.Health");
  for (const char* bad : {"", "/", "//Join", "/x.Y/", "x.Y/Join", "/x.Y/Join/More", "/x.Y"}) {
    EXPECT_EQ(ServiceOfMethod(bad), "") << bad;
  }
}

TEST_F(TlsCallTest, TokensAreCheckedPerService) {
  TokenAuthOptions auth;
  auth.tokens = {{"alice", "good-token-1"}, {"admin", "good-token-2"}};
  auth.certificate_services = {"w.W"};
  auth.open_services = {"grpc.health.v1.Health"};
  Serve(Identity("coordinator"), ClientCertificate::kOptional, auth);
  TlsOptions token_only;
  token_only.ca_file = Path("ca.pem");
  EXPECT_TRUE(Call(token_only, "/c.C/List", "good-token-2").ok());
  EXPECT_TRUE(Call(Identity("client"), "/c.C/List", "good-token-1").ok());
  const grpc::Status missing = Call(Identity("client"), "/c.C/List");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("missing token"));
  const grpc::Status wrong = Call(token_only, "/c.C/List", "good-token-3");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.error_message(), "invalid token");  // no hint about valid ones
  // Worker calls need a certificate, no token; the health check needs neither.
  EXPECT_TRUE(Call(Identity("worker-0"), "/w.W/Join").ok());
  EXPECT_EQ(Call(token_only, "/w.W/Join", "good-token-1").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(token_only, "/grpc.health.v1.Health/Check").ok());
  // By service: every method of the worker service, none of another with a similar name.
  EXPECT_EQ(Call(token_only, "/w.W/FetchState", "good-token-1").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(token_only, "/w.Wx/Join").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::vector<std::string> lines = log();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("refused /c.C/List from certificate CN=client: missing token"));
  EXPECT_THAT(lines[1], HasSubstr("from a peer without a certificate: invalid token"));
  EXPECT_THAT(lines[2], HasSubstr("/w.W/Join is a worker call (w.W)"));
  EXPECT_THAT(lines[3], HasSubstr("/w.W/FetchState is a worker call (w.W)"));
  EXPECT_THAT(lines[4], HasSubstr("/w.Wx/Join from a peer without a certificate: missing token"));
}

TEST_F(TlsCallTest, WithoutTokensClientsNeedACertificate) {
  TokenAuthOptions auth;
  Serve(Identity("coordinator"), ClientCertificate::kOptional, auth);
  TlsOptions token_only;
  token_only.ca_file = Path("ca.pem");
  EXPECT_TRUE(Call(Identity("client"), "/c.C/List").ok());
  EXPECT_EQ(Call(token_only, "/c.C/List").error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(ChannelCredentialsTest, ATokenIsNeverSentInClear) {
  const absl::Status s = MakeChannelCredentials(TlsOptions(), "secret").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("only over TLS"));
}

}  // namespace
}  // namespace pipetrain::net
