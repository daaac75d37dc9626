// Transport security end to end (issue 10; docs/security.md), real daemons on 127.0.0.1 with a
// test CA made at test time (scripts/make_test_certs.sh):
//  - a job trains over mTLS (client certificate + token) and equals `pipetrain reference` bit
//    for bit, losses and checkpoint files;
//  - a client without a certificate, without a token or with a wrong one is refused with
//    UNAVAILABLE / UNAUTHENTICATED and a clear message; a token-only client works on the
//    coordinator's --client-listen port when it has --auth-token-file;
//  - a worker with a certificate from another CA, or one that does not name its advertised host
//    or the name it registers, cannot register;
//  - a daemon asked to listen on a non-loopback address without TLS refuses to start.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/net/test_certs.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = testing::MakeTestCerts();
    ASSERT_FALSE(certs_.empty()) << "scripts/make_test_certs.sh failed";
    dir_ = testing::TempDir("security_test_");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    EXPECT_EQ(daemons_.Stop(), "");
    std::system(absl::StrCat("rm -rf '", dir_, "' '", certs_, "'").c_str());
  }

  std::string Cert(const std::string& file) const { return absl::StrCat(certs_, "/", file); }

  // --tls-cert/--tls-key/--tls-ca of certificate `name`.
  std::vector<std::string> TlsFlags(const std::string& name) const {
    return {"--tls-cert",        Cert(name + ".pem"), "--tls-key",
            Cert(name + ".key"), "--tls-ca",          Cert("ca.pem")};
  }
  std::string TlsArgs(const std::string& name) const { return absl::StrJoin(TlsFlags(name), " "); }
  // The first token of the test token file.
  std::string Token() const {
    return std::string(absl::StripAsciiWhitespace(
        std::vector<std::string>(absl::StrSplit(ReadFile(Cert("tokens")), '\n'))[0]));
  }
  // SDK options with the CA, and `name`'s certificate unless empty.
  client::ClientOptions ClientTls(const std::string& name, const std::string& token) const {
    client::ClientOptions o;
    o.connect_timeout = absl::Seconds(3);
    o.tls.ca_file = Cert("ca.pem");
    if (!name.empty()) {
      o.tls.cert_file = Cert(name + ".pem");
      o.tls.key_file = Cert(name + ".key");
    }
    o.token = token;
    return o;
  }

  // Starts a TLS coordinator with tokens and two workers, worker-0 and worker-1, each with its
  // own certificate (which names 127.0.0.1 and has the worker's name as its common name), plus
  // `coordinator_flags`.
  void StartTlsCluster(std::vector<std::string> coordinator_flags = {}) {
    std::vector<std::string> flags = TlsFlags("coordinator");
    flags.insert(flags.end(), {"--auth-token-file", Cert("tokens"), "--checkpoint-root", dir_});
    flags.insert(flags.end(), coordinator_flags.begin(), coordinator_flags.end());
    const std::string started = daemons_.Start(dir_, 2, flags, TlsFlags("worker-{w}"),
                                               ClientTls("client", Token()), "worker-");
    ASSERT_EQ(started, "");
  }

  // `pipetrain ARGS`, stderr into `err`.
  testing::CommandRun Pipetrain(const std::string& args, const std::string& err) {
    return testing::RunCommand(absl::StrCat(PIPETRAIN_BINARY, " ", args, " 2>", err));
  }

  // Waits (at most 20 s) until the file at `path` contains `text`.
  static bool AwaitLog(const std::string& path, const std::string& text) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      if (absl::StrContains(ReadFile(path), text)) return true;
      absl::SleepFor(absl::Milliseconds(20));  // polling a log file, not synchronisation.
    }
    return false;
  }

  std::string certs_;
  std::string dir_;
  testing::Daemons daemons_;
};

// The {"step": N, "loss": X prefix of each --json step line.
std::vector<std::string> LossLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "{\"step\"")) continue;
    const size_t loss = line.find("\"loss\": ");
    lines.emplace_back(line.substr(0, line.find_first_of(",}", loss)));
  }
  return lines;
}

TEST_F(SecurityTest, JobTrainsOverMutualTlsBitwiseEqualToTheReference) {
  StartTlsCluster();
  const std::string common = absl::StrCat("--model ", testing::Example("mlp_digits.textproto"),
                                          " --batch 16 --microbatches 4 --steps 3 --seed 5 --json");
  const testing::CommandRun ref = Pipetrain(
      absl::StrCat("reference ", common, " --eval-samples 1 --save ", dir_, "/ref"), "/dev/null");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const std::string train = absl::StrCat(
      PIPETRAIN_BINARY, " train --coordinator ", daemons_.address(), " ", TlsArgs("client"),
      " --stages 2 --eval-samples 1 ", common, " --save ", dir_, "/tls 2>", dir_, "/train.err");
  // Without the token: refused before any job is made.
  const testing::CommandRun refused = testing::RunCommand(train);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(ReadFile(dir_ + "/train.err"), HasSubstr("missing token"));
  // With it (from the environment): bitwise the reference's losses and files.
  const testing::CommandRun run =
      testing::RunCommand(absl::StrCat("PIPETRAIN_TOKEN=", Token(), " ", train));
  ASSERT_EQ(run.exit_code, 0) << run.out << ReadFile(dir_ + "/train.err");
  ASSERT_EQ(LossLines(ref.out).size(), 3u);
  EXPECT_EQ(LossLines(run.out), LossLines(ref.out));
  for (const char* f : {"layer-00000.safetensors", "layer-00002.safetensors", "manifest.json"}) {
    const std::string want = ReadFile(absl::StrCat(dir_, "/ref/", f));
    EXPECT_FALSE(want.empty()) << f;
    EXPECT_TRUE(ReadFile(absl::StrCat(dir_, "/tls/", f)) == want) << f << " differs";
  }
}

TEST_F(SecurityTest, ClientsWithoutCertificateOrTokenAreRefused) {
  StartTlsCluster();
  // Certificate and token: served.
  absl::StatusOr<std::unique_ptr<client::Client>> good =
      client::Client::Connect(daemons_.address(), ClientTls("client", Token()));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->ListJobs().ok());
  // Certificate, no token / a wrong token: UNAUTHENTICATED, no hint about valid tokens.
  absl::StatusOr<std::unique_ptr<client::Client>> tokenless =
      client::Client::Connect(daemons_.address(), ClientTls("client", ""));
  ASSERT_TRUE(tokenless.ok()) << tokenless.status();
  const absl::Status missing = (*tokenless)->ListJobs().status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("missing token"));
  absl::StatusOr<std::unique_ptr<client::Client>> wrong =
      client::Client::Connect(daemons_.address(), ClientTls("client", "not-a-token"));
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  const absl::Status invalid = (*wrong)->ListJobs().status();
  EXPECT_EQ(invalid.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(invalid.message(), HasSubstr("invalid token"));
  EXPECT_THAT(invalid.message(), ::testing::Not(HasSubstr(Token())));
  // The coordinator logs each refusal.
  EXPECT_TRUE(AwaitLog(dir_ + "/coordinator.log", "refused /pipetrain.v1.Coordinator/ListJobs"));
  // A token but no certificate on --listen (which requires one): the handshake fails.
  absl::StatusOr<std::unique_ptr<client::Client>> certless =
      client::Client::Connect(daemons_.address(), ClientTls("", Token()));
  const absl::Status no_cert = certless.ok() ? (*certless)->ListJobs().status() : certless.status();
  EXPECT_EQ(no_cert.code(), absl::StatusCode::kUnavailable) << no_cert;
  // Plaintext to a TLS coordinator.
  client::ClientOptions plain;
  plain.connect_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<client::Client>> plaintext =
      client::Client::Connect(daemons_.address(), plain);
  EXPECT_EQ(plaintext.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(plaintext.status().message(), HasSubstr("cannot reach the coordinator"));
  // The CLI says so and exits 1.
  const std::string err = dir_ + "/jobs.err";
  const testing::CommandRun jobs = Pipetrain(
      absl::StrCat("jobs --coordinator ", daemons_.address(), " ", TlsArgs("client")), err);
  EXPECT_EQ(jobs.exit_code, 1);
  EXPECT_THAT(ReadFile(err), HasSubstr("missing token"));
  EXPECT_THAT(ReadFile(err), HasSubstr("[UNAUTHENTICATED]"));
}

// A free TCP port on 127.0.0.1 (bound, read and released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST_F(SecurityTest, TokenOnlyClientWorksOnTheClientPort) {
  const std::string client_port = absl::StrCat("127.0.0.1:", FreePort());
  StartTlsCluster({"--client-listen", client_port});
  absl::StatusOr<std::unique_ptr<client::Client>> token_only =
      client::Client::Connect(client_port, ClientTls("", Token()));
  ASSERT_TRUE(token_only.ok()) << token_only.status();
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = (*token_only)->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(workers->size(), 2u);
  // Without a token it is refused there too; and no worker call gets in without a certificate.
  absl::StatusOr<std::unique_ptr<client::Client>> nothing =
      client::Client::Connect(client_port, ClientTls("", ""));
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ((*nothing)->ListJobs().status().code(), absl::StatusCode::kUnauthenticated);
  const std::string err = dir_ + "/jobs.err";
  const testing::CommandRun jobs =
      Pipetrain(absl::StrCat("jobs --coordinator ", client_port, " --tls-ca ", Cert("ca.pem"),
                             " --token-file ", Cert("tokens")),
                err);
  EXPECT_EQ(jobs.exit_code, 0) << ReadFile(err);
  EXPECT_THAT(jobs.out, HasSubstr("no jobs"));
}

// A job belongs to the principal that created it ("NAME:TOKEN" lines of the token file): another
// principal sees no such job and can neither cancel nor train it; admin sees every job. The
// token file is reloaded when it changes: a principal added there gets in without a restart.
TEST_F(SecurityTest, AJobBelongsToItsPrincipalAndTheTokenFileReloads) {
  const std::string tokens = dir_ + "/principals";
  const std::string admin = "admin-token-0123456789", alice = "alice-token-0123456789",
                    bob = "bob-token-0123456789", carol = "carol-token-0123456789";
  ASSERT_TRUE(io::WriteFileAtomically(tokens, absl::StrCat("# principals\nalice:", alice,
                                                           "\nbob:", bob, "\nadmin:", admin, "\n"))
                  .ok());
  std::vector<std::string> flags = TlsFlags("coordinator");
  flags.insert(flags.end(), {"--auth-token-file", tokens, "--auth-token-reload", "100ms",
                             "--checkpoint-root", dir_});
  ASSERT_EQ(
      daemons_.Start(dir_, 2, flags, TlsFlags("worker-{w}"), ClientTls("client", admin), "worker-"),
      "");
  auto connect = [&](const std::string& token) {
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        client::Client::Connect(daemons_.address(), ClientTls("client", token));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  };
  std::unique_ptr<client::Client> as_alice = connect(alice), as_bob = connect(bob),
                                  as_admin = connect(admin);
  ASSERT_TRUE(as_alice && as_bob && as_admin);
  absl::StatusOr<v1::JobSpec> spec = testing::DigitsJobSpec(2);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobStatus> job = as_alice->CreateJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->owner(), "alice");
  EXPECT_EQ(as_bob->GetJob(job->job()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(as_bob->CancelJob(job->job(), "not yours").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<v1::JobStatus>> bobs = as_bob->ListJobs();
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_TRUE(bobs->empty());
  absl::StatusOr<std::vector<v1::JobStatus>> all = as_admin->ListJobs();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].owner(), "alice");
  // carol is not known yet; the file gains her line and the coordinator takes it (bounded wait).
  std::unique_ptr<client::Client> as_carol = connect(carol);
  ASSERT_TRUE(as_carol);
  EXPECT_EQ(as_carol->ListJobs().status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(io::WriteFileAtomically(
                  tokens, absl::StrCat("alice:", alice, "\nadmin:", admin, "\ncarol:", carol, "\n"))
                  .ok());
  absl::StatusOr<std::vector<v1::JobStatus>> carols = as_carol->ListJobs();
  for (int i = 0; i < 200 && !carols.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));  // polling the reload, not synchronisation.
    carols = as_carol->ListJobs();
  }
  ASSERT_TRUE(carols.ok()) << carols.status();
  EXPECT_TRUE(carols->empty());  // alice's job stays hers.
  // bob's line is gone: his token no longer gets in.
  EXPECT_EQ(as_bob->ListJobs().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(as_alice->CancelJob(job->job(), "done").ok());
}

TEST_F(SecurityTest, WorkersFromAnotherCaOrForAnotherHostCannotRegister) {
  StartTlsCluster();
  const std::vector<std::pair<std::string, std::string>> rogues = {
      {"other-worker", "certificate verify failed"},  // signed by another CA
      {"worker-wronghost", ""}};                      // names wronghost.invalid only
  for (const auto& [cert, _] : rogues) {
    std::vector<std::string> argv = {PIPETRAIN_STAGE_WORKER_BINARY,
                                     "--coordinator",
                                     daemons_.address(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--name",
                                     cert};
    const std::vector<std::string> tls = TlsFlags(cert);
    argv.insert(argv.end(), tls.begin(), tls.end());
    const pid_t pid = testing::Spawn(argv, absl::StrCat(dir_, "/", cert, ".log"));
    ASSERT_GT(pid, 0);
    // Its control stream fails and it redials: evidence it was refused.
    EXPECT_TRUE(AwaitLog(absl::StrCat(dir_, "/", cert, ".log"), "redialling"))
        << ReadFile(absl::StrCat(dir_, "/", cert, ".log"));
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(AwaitLog(dir_ + "/coordinator.log",
                       "RegisterWorker 'worker-wronghost': the peer's certificate names "
                       "wronghost.invalid, not '127.0.0.1'"))
      << ReadFile(dir_ + "/coordinator.log");
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemons_.client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  for (const v1::WorkerInfo& w : *workers) EXPECT_TRUE(absl::StartsWith(w.name(), "w")) << w.name();
}

// A worker's name is bound to its certificate (issue 34): the coordinator's certificate — of the
// CA, naming 127.0.0.1 — used to register a process as 'worker-0' while the real worker-0 was
// registered (a newer incarnation displaced it; registered first, it would have locked the real
// one out with ALREADY_EXISTS). Now it is refused with PERMISSION_DENIED naming the rule, and the
// real worker-0 stays, at its own address.
TEST_F(SecurityTest, AWorkerCannotTakeAnotherWorkersName) {
  StartTlsCluster();
  auto address_of = [this](const std::string& name) -> std::string {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemons_.client().ListWorkers();
    if (!workers.ok()) return workers.status().ToString();
    for (const v1::WorkerInfo& w : *workers) {
      if (w.name() == name) return w.address();
    }
    return "";
  };
  const std::string real = address_of("worker-0");
  ASSERT_FALSE(real.empty());
  for (const std::string name : {"worker-0", "worker-9"}) {
    std::vector<std::string> argv = {PIPETRAIN_STAGE_WORKER_BINARY,
                                     "--coordinator",
                                     daemons_.address(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--name",
                                     name};
    const std::vector<std::string> tls = TlsFlags("coordinator");
    argv.insert(argv.end(), tls.begin(), tls.end());
    const std::string log = absl::StrCat(dir_, "/impostor-", name, ".log");
    const pid_t pid = testing::Spawn(argv, log);
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(AwaitLog(log, "redialling")) << ReadFile(log);
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    EXPECT_THAT(ReadFile(log), HasSubstr("PERMISSION_DENIED"));
    EXPECT_TRUE(AwaitLog(dir_ + "/coordinator.log",
                         absl::StrCat("RegisterWorker '", name,
                                      "': the peer's certificate (CN 'coordinator'; names "
                                      "127.0.0.1, localhost) does not vouch for the name '",
                                      name, "'")))
        << ReadFile(dir_ + "/coordinator.log");
  }
  EXPECT_EQ(address_of("worker-0"), real);
  EXPECT_EQ(address_of("worker-9"), "");
  // The real workers still train.
  absl::StatusOr<v1::JobSpec> spec = testing::DigitsJobSpec(2);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobStatus> job = daemons_.client().CreateJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(daemons_.client().CancelJob(job->job(), "done").ok());
}

TEST_F(SecurityTest, DaemonsRefusePlaintextOnNonLoopbackAddresses) {
  const std::string err = dir_ + "/refused.err";
  const testing::CommandRun coordinator = testing::RunCommand(
      absl::StrCat("timeout 20 ", PIPETRAIN_COORDINATOR_BINARY, " --listen 0.0.0.0:0 2>", err));
  EXPECT_EQ(coordinator.exit_code, 2);
  EXPECT_THAT(ReadFile(err), HasSubstr("refusing to serve plaintext gRPC on --listen 0.0.0.0:0"));
  EXPECT_THAT(ReadFile(err), HasSubstr("--insecure"));
  const testing::CommandRun client_port = testing::RunCommand(absl::StrCat(
      "timeout 20 ", PIPETRAIN_COORDINATOR_BINARY, " --client-listen 0.0.0.0:0 2>", err));
  EXPECT_EQ(client_port.exit_code, 2);
  EXPECT_THAT(ReadFile(err), HasSubstr("--client-listen 0.0.0.0:0"));
  const testing::CommandRun worker = testing::RunCommand(
      absl::StrCat("timeout 20 ", PIPETRAIN_STAGE_WORKER_BINARY,
                   " --coordinator 127.0.0.1:1 --listen 0.0.0.0:0 --emulate-gflops 1 2>", err));
  EXPECT_EQ(worker.exit_code, 2);
  EXPECT_THAT(ReadFile(err), HasSubstr("refusing to serve plaintext gRPC on --listen 0.0.0.0:0"));
  // Tokens are never taken in clear.
  const testing::CommandRun tokens =
      testing::RunCommand(absl::StrCat("timeout 20 ", PIPETRAIN_COORDINATOR_BINARY,
                                       " --auth-token-file ", Cert("tokens"), " 2>", err));
  EXPECT_EQ(tokens.exit_code, 2);
  EXPECT_THAT(ReadFile(err), HasSubstr("--auth-token-file needs TLS"));
}

}  // namespace
}  // namespace pipetrain
