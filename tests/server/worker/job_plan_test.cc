// PlanJob: a valid Assign's plan, and the first malformed field of an invalid one named with
// its code.
#include "server/worker/job_plan.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/math/isa.h"
#include "common/math/optimizer.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/control/control_proto.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::worker {
namespace {

using schedule::Action;
using schedule::Op;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Rank 0 of a job of two stages over the 6-layer MLP: chunk 0 = layers [0, 3) on rank 0,
// chunk 1 = [3, 6) on rank 1; two micro-batches.
v1::Assign ValidAssign() {
  v1::Assign a;
  a.set_job("job-a");
  a.set_generation(4);
  a.set_rank(0);
  absl::StatusOr<v1::ModelSpec> spec =
      model::ParseModelSpecText(model::testing::kMlpSpec, "kMlpSpec");
  EXPECT_TRUE(spec.ok()) << spec.status();
  *a.mutable_model() = *spec;
  math::OptimizerConfig sgd;
  sgd.kind = math::OptimizerKind::kSgd;
  sgd.lr = 0.5f;
  *a.mutable_optimizer() = model::OptimizerToProto(sgd);
  a.set_threads(1);
  a.set_stages(2);
  a.set_virtual_stages(1);
  a.set_microbatches(2);
  for (int c = 0; c < 2; ++c) {
    v1::ChunkSpec* chunk = a.add_chunks();
    chunk->set_chunk(c);
    chunk->set_rank(c);
    chunk->set_first_layer(3 * c);
    chunk->set_last_layer(3 * c + 3);
  }
  a.add_worker_addresses("127.0.0.1:1");
  a.add_worker_addresses("127.0.0.1:2");
  for (const Action& act : {Action{Op::kForward, 0, 0}, Action{Op::kForward, 1, 0},
                            Action{Op::kBackward, 0, 0}, Action{Op::kBackward, 1, 0}}) {
    *a.add_actions() = control::ActionToProto(act);
  }
  a.set_link_secret("secret");
  return a;
}

TEST(JobPlanTest, ValidAssignIsPlanned) {
  absl::StatusOr<JobPlan> plan = PlanJob(ValidAssign(), 1, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_chunks, 2);
  EXPECT_THAT(plan->owner, ElementsAre(0, 1));
  EXPECT_THAT(plan->actions, ElementsAre(Action{Op::kForward, 0, 0}, Action{Op::kForward, 1, 0},
                                         Action{Op::kBackward, 0, 0}, Action{Op::kBackward, 1, 0}));
  ASSERT_NE(plan->model, nullptr);
  EXPECT_EQ(plan->model->num_layers(), 6);
  // Empty Assign.isa: the lowest level built.
  EXPECT_EQ(plan->model->isa(), math::BuiltIsas().front());
  EXPECT_EQ(plan->optimizer.kind, math::OptimizerKind::kSgd);
  EXPECT_EQ(plan->optimizer.lr, 0.5f);
}

// Two copies of the stages (dualpipe, V = 2): chunks 0, 1 tile the model on ranks 0, 1; chunk 2
// repeats chunk 0 on rank 1, chunk 3 repeats chunk 1 on rank 0.
v1::Assign DualPipeAssign() {
  v1::Assign a = ValidAssign();
  a.set_virtual_stages(2);
  const int ranks[] = {0, 1, 1, 0};
  a.clear_chunks();
  for (int c = 0; c < 4; ++c) {
    v1::ChunkSpec* chunk = a.add_chunks();
    chunk->set_chunk(c);
    chunk->set_rank(ranks[c]);
    chunk->set_first_layer(3 * (c % 2));
    chunk->set_last_layer(3 * (c % 2) + 3);
  }
  a.clear_actions();
  for (const Action& act : {Action{Op::kForward, 0, 0}, Action{Op::kForward, 1, 3},
                            Action{Op::kBackward, 1, 3}, Action{Op::kBackward, 0, 0}}) {
    *a.add_actions() = control::ActionToProto(act);
  }
  return a;
}

TEST(JobPlanTest, TwoCopiesOfTheStagesArePlannedAndCheckedAsSuch) {
  absl::StatusOr<JobPlan> plan = PlanJob(DualPipeAssign(), 1, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->two_copies);
  EXPECT_THAT(plan->owner, ElementsAre(0, 1, 1, 0));
  EXPECT_FALSE(PlanJob(ValidAssign(), 1, std::nullopt)->two_copies);

  v1::Assign misplaced = DualPipeAssign();
  misplaced.mutable_chunks(2)->set_rank(0);
  misplaced.mutable_chunks(3)->set_rank(1);
  absl::Status status = PlanJob(misplaced, 1, std::nullopt).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("chunk 2 is on rank 0; two copies of the stages "
                                          "(dualpipe) put chunk c < S on rank c and chunk S+k "
                                          "on rank S-1-k (1)"));
  v1::Assign other_layers = DualPipeAssign();
  other_layers.mutable_chunks(2)->set_last_layer(2);
  other_layers.mutable_chunks(3)->set_first_layer(2);
  status = PlanJob(other_layers, 1, std::nullopt).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("chunk 2 has layers [0, 2); two copies of the stages "
                                          "(dualpipe) need chunks 0..S-1 to tile [0, 6)"));
}

TEST(JobPlanTest, MalformedFieldsAreInvalidArgumentNamingThem) {
  struct Case {
    const char* name;
    void (*mutate)(v1::Assign*);
    const char* message;
  };
  const Case cases[] = {
      {"job", [](v1::Assign* a) { a->clear_job(); }, "Assign(job , generation 4): empty job id"},
      {"generation", [](v1::Assign* a) { a->set_generation(-1); },
       "Assign(job job-a, generation -1): generation -1 < 0"},
      {"stages", [](v1::Assign* a) { a->set_microbatches(0); },
       "stages (2), virtual_stages (1) and microbatches (0) must be >= 1"},
      {"rank", [](v1::Assign* a) { a->set_rank(2); }, "rank 2 is outside [0, 2)"},
      {"secret", [](v1::Assign* a) { a->clear_link_secret(); }, "no link_secret"},
      {"threads", [](v1::Assign* a) { a->set_threads(2); }, "threads 2 is outside [1, 1]"},
      {"addresses", [](v1::Assign* a) { a->add_worker_addresses("x:3"); },
       "3 worker addresses for 2 stages"},
      {"chunk count", [](v1::Assign* a) { a->set_virtual_stages(2); },
       "2 chunks, expected stages * virtual_stages = 4"},
      {"isa", [](v1::Assign* a) { a->set_isa("x86-64-v9"); },
       "isa: unknown instruction set 'x86-64-v9'"},
      {"model", [](v1::Assign* a) { a->mutable_model()->clear_layers(); }, "model: "},
      {"tiling", [](v1::Assign* a) { a->mutable_chunks(1)->set_first_layer(2); },
       "chunk 1 has layers [2, 6); chunks must tile [0, 6) in order, each non-empty"},
      {"placement", [](v1::Assign* a) { a->mutable_chunks(1)->set_rank(7); },
       "chunk 1 is on rank 7 outside [0, 2)"},
      {"address", [](v1::Assign* a) { a->set_worker_addresses(1, ""); }, "rank 1 has no address"},
      {"no actions", [](v1::Assign* a) { a->clear_actions(); }, "no actions"},
      {"foreign action",
       [](v1::Assign* a) {
         *a->mutable_actions(0) = control::ActionToProto(Action{Op::kForward, 0, 1});
       },
       "action 0 F(mb=0, chunk=1) is on a chunk this worker (rank 0) does not hold"},
      {"micro-batch",
       [](v1::Assign* a) {
         *a->mutable_actions(1) = control::ActionToProto(Action{Op::kForward, 2, 0});
       },
       "action 1 F(mb=2, chunk=0) has a micro-batch outside [0, 2)"},
      {"optimizer", [](v1::Assign* a) { a->mutable_optimizer()->Clear(); },
       "optimizer: optimizer spec sets neither sgd nor adamw"},
  };
  for (const Case& c : cases) {
    v1::Assign a = ValidAssign();
    c.mutate(&a);
    absl::StatusOr<JobPlan> plan = PlanJob(a, 1, std::nullopt);
    ASSERT_FALSE(plan.ok()) << c.name;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(plan.status().message(), HasSubstr("Assign(job ")) << c.name;
  }
}

// Replica 1 of 4 of the same job: replica_addresses[1] is this worker's own address.
v1::Assign ReplicaAssign() {
  v1::Assign a = ValidAssign();
  a.set_replica(1);
  a.set_replicas(4);
  for (const char* address : {"10.0.0.1:7000", "127.0.0.1:1", "10.0.0.3:7000", "[::1]:7000"}) {
    a.add_replica_addresses(address);
  }
  return a;
}

TEST(JobPlanTest, ReplicasArePlanned) {
  absl::StatusOr<JobPlan> plan = PlanJob(ReplicaAssign(), 1, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replica, 1);
  EXPECT_EQ(plan->replicas, 4);
  EXPECT_THAT(plan->replica_addresses,
              ElementsAre("10.0.0.1:7000", "127.0.0.1:1", "10.0.0.3:7000", "[::1]:7000"));
  // An Assign without the fields (replicas 0): one replica, no peers.
  plan = PlanJob(ValidAssign(), 1, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replica, 0);
  EXPECT_EQ(plan->replicas, 1);
  EXPECT_TRUE(plan->replica_addresses.empty());
}

TEST(JobPlanTest, MalformedReplicaFieldsAreInvalidArgumentNamingThem) {
  struct Case {
    const char* name;
    void (*mutate)(v1::Assign*);
    const char* message;
  };
  const Case cases[] = {
      {"not a power of two", [](v1::Assign* a) { a->set_replicas(3); },
       "replicas 3 is not a power of two >= 1 (0 means 1)"},
      {"negative", [](v1::Assign* a) { a->set_replicas(-2); },
       "replicas -2 is not a power of two >= 1"},
      {"replica", [](v1::Assign* a) { a->set_replica(4); },
       "replica 4 is outside [0, 4) (replicas)"},
      {"negative replica", [](v1::Assign* a) { a->set_replica(-1); },
       "replica -1 is outside [0, 4)"},
      {"count", [](v1::Assign* a) { a->add_replica_addresses("10.0.0.5:7000"); },
       "5 replica_addresses for 4 replicas"},
      {"none", [](v1::Assign* a) { a->clear_replica_addresses(); },
       "0 replica_addresses for 4 replicas"},
      {"no port", [](v1::Assign* a) { a->set_replica_addresses(2, "10.0.0.3"); },
       "replica_addresses[2] '10.0.0.3' is not host:port"},
      {"bad port", [](v1::Assign* a) { a->set_replica_addresses(0, "h:70000"); },
       "replica_addresses[0] 'h:70000' is not host:port"},
      {"no host", [](v1::Assign* a) { a->set_replica_addresses(3, ":7000"); },
       "replica_addresses[3] ':7000' is not host:port"},
      {"own address", [](v1::Assign* a) { a->set_replica_addresses(1, "127.0.0.1:2"); },
       "replica_addresses[1] '127.0.0.1:2' is not this worker's own address "
       "worker_addresses[0] '127.0.0.1:1'"},
      {"replica of one",
       [](v1::Assign* a) {
         a->set_replicas(1);
         a->set_replica(0);
       },
       "4 replica_addresses for 1 replicas"},
  };
  for (const Case& c : cases) {
    v1::Assign a = ReplicaAssign();
    c.mutate(&a);
    absl::StatusOr<JobPlan> plan = PlanJob(a, 1, std::nullopt);
    ASSERT_FALSE(plan.ok()) << c.name;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(plan.status().message(), HasSubstr("Assign(job job-a, generation 4): ")) << c.name;
  }
}

TEST(JobPlanTest, AnInstructionSetAboveTheWorkersIsFailedPrecondition) {
  const std::vector<math::Isa> runnable = math::SupportedIsas();
  if (runnable.size() < 2) {
    GTEST_SKIP() << "this build or CPU has a single instruction-set level";
  }
  v1::Assign a = ValidAssign();
  a.set_isa(std::string(math::IsaName(runnable.back())));
  absl::StatusOr<JobPlan> plan = PlanJob(a, 1, runnable.front());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(),
              HasSubstr(absl::StrCat("Assign(job job-a, generation 4): this worker cannot run "
                                     "instruction set ",
                                     math::IsaName(runnable.back()))));
}

}  // namespace
}  // namespace pipetrain::worker
