// What `pipetrain plan --coordinator` makes of the workers' layer profiles
// (client/cli/worker_profiles.h): the request, each worker's figures matched by name and checked,
// and a note for every worker left to its GFLOP/s.
#include "client/cli/worker_profiles.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Worker `name`'s answer of 2 layers at `samples` samples, F of layer l = base x (l + 1).
v1::WorkerLayerProfile Entry(const std::string& name, int64_t samples, double base) {
  v1::WorkerLayerProfile e;
  e.set_name(name);
  e.set_gflops(50);
  v1::SampleLayerCosts* c = e.add_costs();
  c->set_samples(samples);
  for (int l = 0; l < 2; ++l) {
    v1::LayerSeconds* s = c->add_layers();
    s->set_forward(base * (l + 1));
    s->set_backward_input(base);
    s->set_backward_weight(base);
  }
  return e;
}

std::vector<plan::WorkerResources> Workers() {
  return {{"w0", 50, 0}, {"w1", 50, 0}, {"w2", 50, 0}, {"w3", 50, 0}};
}

TEST(WorkerProfilesTest, TheRequestAsksForEveryMicrobatchSize) {
  std::map<int, plan::ModelCosts> by_m;
  by_m[1].samples = 8;
  by_m[2].samples = 4;
  by_m[8].samples = 1;
  v1::ModelSpec model;
  model.set_input_features(3);
  math::OptimizerConfig sgd;
  const v1::ProfileWorkersRequest r = ProfileRequestFor(model, by_m, 2, sgd, "x86-64-v3");
  EXPECT_THAT(r.samples(), ElementsAre(8, 4, 1));
  EXPECT_EQ(r.threads(), 2);
  EXPECT_EQ(r.isa(), "x86-64-v3");
  EXPECT_EQ(r.model().input_features(), 3);
}

TEST(WorkerProfilesTest, FiguresByNameAndANoteForEachWorkerWithout) {
  v1::ProfileWorkersResponse response;
  *response.add_workers() = Entry("w2", 4, 0.5);  // out of the planner's order.
  *response.add_workers() = Entry("w0", 4, 1);
  v1::WorkerLayerProfile failed;
  failed.set_name("w1");
  failed.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  failed.set_message("worker 'w1' did not answer within 10 ms");
  *response.add_workers() = failed;
  const WorkerProfiles p = ProfilesFromResponse(response, Workers(), 2);
  ASSERT_EQ(p.measured.size(), 4u);
  ASSERT_EQ(p.measured[0].count(4), 1u);
  EXPECT_EQ(p.measured[0].at(4).layers[1].forward, 2);
  EXPECT_EQ(p.measured[0].at(4).gflops, 50);
  EXPECT_TRUE(p.measured[1].empty());
  EXPECT_EQ(p.measured[2].at(4).layers[1].forward, 1);
  EXPECT_TRUE(p.measured[3].empty());
  EXPECT_THAT(p.notes, ElementsAre("w1: DEADLINE_EXCEEDED: worker 'w1' did not answer within 10 ms",
                                   "w3: not profiled (it was not idle when asked)"));
}

TEST(WorkerProfilesTest, FiguresOfTheWrongShapeLeaveTheWorkerUnprofiled) {
  v1::ProfileWorkersResponse response;
  *response.add_workers() = Entry("w0", 4, 1);
  v1::WorkerLayerProfile negative = Entry("w1", 4, -1);
  *response.add_workers() = negative;
  const WorkerProfiles p = ProfilesFromResponse(response, Workers(), 3);  // the model has 3.
  EXPECT_TRUE(p.measured[0].empty());
  EXPECT_TRUE(p.measured[1].empty());
  ASSERT_GE(p.notes.size(), 2u);
  EXPECT_THAT(p.notes[0], HasSubstr("w0: worker 'w0': layer costs for 4 samples have 2 layers; "
                                    "the model has 3"));
  const WorkerProfiles q = ProfilesFromResponse(response, Workers(), 2);
  EXPECT_FALSE(q.measured[0].empty());
  EXPECT_TRUE(q.measured[1].empty());
  EXPECT_THAT(q.notes[0], HasSubstr("w1: worker 'w1': layer 0 at 4 samples has -1 seconds"));
}

}  // namespace
}  // namespace pipetrain::cli
