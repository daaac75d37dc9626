// The planner's choices on hand-made costs whose best plan is known.
#include "common/plan/planner.h"

#include <map>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain::plan {
namespace {

using schedule::ScheduleKind;

// L equal layers of micro-batches of `samples` samples: per layer op seconds f, i, w (at 1
// GFLOP/s), `act` stashed and `out` sent bytes per sample.
ModelCosts Equal(int layers, int64_t samples, double f, double i, double w, double act = 0,
                 double out = 0) {
  ModelCosts c;
  c.samples = samples;
  c.gflops = 1;
  for (int l = 0; l < layers; ++l) {
    LayerCost lc;
    lc.forward = f;
    lc.backward_input = i;
    lc.backward_weight = w;
    lc.activation_bytes = act * samples;
    lc.output_bytes = out * samples;
    c.layers.push_back(lc);
  }
  return c;
}

PlannerOptions Options(int64_t batch, int workers, std::vector<ScheduleKind> kinds = {}) {
  PlannerOptions o;
  o.batch = batch;
  for (int w = 0; w < workers; ++w) o.workers.push_back({"w" + std::to_string(w), 1.0, 0});
  o.kinds = std::move(kinds);
  return o;
}

// 1F1B over 2 equal stages with free links: (M + S - 1) x (F + B) and the closed-form bubble.
TEST(PlannerTest, OneFOneBMatchesItsClosedForm) {
  const std::vector<double> flops(4, 1.0);
  const ModelCosts costs = Equal(4, 1, 0.5, 0.5, 0.5);
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, costs, Options(4, 2), 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->step_seconds, 5 * 3.0);
  EXPECT_DOUBLE_EQ(p->samples_per_second, 4 / 15.0);
  EXPECT_DOUBLE_EQ(p->bubble, 1.0 / 5);
  EXPECT_EQ(p->boundaries, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(p->replicas, 1);
}

// Each tensor a worker sends or receives costs it CPU time on the op that moves it: with one
// micro-batch over two stages (F 1 s, B 2 s each) and 1 s per tensor, rank 0's F takes the input
// and sends its output (+2), rank 1's F takes the activation and the targets (+2), rank 1's B
// sends the gradient (+1) and rank 0's B takes it (+1): 6 s of compute become 12. Then each
// worker's RunStep, StepDone and Commit (+3 after rank 0's last action): 15.
TEST(PlannerTest, MessageCpuIsChargedToTheOpsThatMoveTensors) {
  const std::vector<double> flops(2, 1.0);
  PlannerOptions o = Options(1, 2);
  o.link.cpu_seconds_per_message = 1;
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, Equal(2, 1, 1, 1, 1), o, 2, ScheduleKind::kOneFOneB, 1, 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->step_seconds, 15.0);
}

// A chunk timer replaces the layers' sums, once per chunk, micro-batch count and micro-batches in
// flight (GPipe keeps both of a step's 2 in flight on each rank; 1F1B over 2 stages and 4
// micro-batches 2 on rank 0 and 1 on rank 1).
TEST(PlannerTest, ChunkTimerGivesTheChunksSeconds) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(2, 2);
  using Call = std::tuple<std::vector<LayerRange>, int, int>;
  std::vector<Call> calls;
  o.chunk_timer = [&calls](const std::vector<LayerRange>& chunks, int m,
                           int in_flight) -> absl::StatusOr<std::vector<ChunkSeconds>> {
    calls.emplace_back(chunks, m, in_flight);
    return std::vector<ChunkSeconds>(chunks.size(), ChunkSeconds{1, 1, 1, 0.5});
  };
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, Equal(4, 1, 9, 9, 9), o, 2, ScheduleKind::kGPipe, 1, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(calls, (std::vector<Call>{{{{0, 2}}, 2, 2}, {{{2, 4}}, 2, 2}}));
  // The update (0.5 s) first, then GPipe with F 1, B 2 over 2 stages and 2 micro-batches: 9 s.
  EXPECT_DOUBLE_EQ(p->step_seconds, 9.5);
  calls.clear();
  o.batch = 4;
  ASSERT_TRUE(EvaluatePlan(flops, Equal(4, 1, 9, 9, 9), o, 2, ScheduleKind::kOneFOneB, 1, 4).ok());
  EXPECT_EQ(calls, (std::vector<Call>{{{{0, 2}}, 4, 2}, {{{2, 4}}, 4, 1}}));
  // No more micro-batches than kMaxTimedStashBytes of stashes hold: 2 layers of 512 MiB each.
  calls.clear();
  o.batch = 2;
  ASSERT_TRUE(
      EvaluatePlan(flops, Equal(4, 1, 9, 9, 9, 512.0 * (1 << 20)), o, 2, ScheduleKind::kGPipe, 1, 2)
          .ok());
  EXPECT_EQ(calls, (std::vector<Call>{{{{0, 2}}, 2, 1}, {{{2, 4}}, 2, 1}}));
  o.chunk_timer = [](const std::vector<LayerRange>&, int,
                     int) -> absl::StatusOr<std::vector<ChunkSeconds>> {
    return absl::ResourceExhaustedError("chunk too large");
  };
  EXPECT_EQ(
      EvaluatePlan(flops, Equal(4, 1, 9, 9, 9), o, 2, ScheduleKind::kGPipe, 1, 2).status().code(),
      absl::StatusCode::kResourceExhausted);
  o.chunk_timer = [](const std::vector<LayerRange>&, int,
                     int) -> absl::StatusOr<std::vector<ChunkSeconds>> {
    return std::vector<ChunkSeconds>{};
  };
  EXPECT_EQ(
      EvaluatePlan(flops, Equal(4, 1, 9, 9, 9), o, 2, ScheduleKind::kGPipe, 1, 2).status().code(),
      absl::StatusCode::kInternal);
}

// The timer gets every chunk a worker holds, together, and each chunk takes its own figure: an
// interleaved plan of 2 stages x 2 virtual puts chunks 0 and 2 on rank 0, 1 and 3 on rank 1.
TEST(PlannerTest, ChunkTimerTimesAWorkersChunksTogether) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(2, 2);
  std::map<std::vector<LayerRange>, int> calls;
  o.chunk_timer = [&calls](const std::vector<LayerRange>& chunks, int,
                           int) -> absl::StatusOr<std::vector<ChunkSeconds>> {
    ++calls[chunks];
    std::vector<ChunkSeconds> s;
    // Each chunk's F is its first layer + 1 s: which figure goes to which chunk shows.
    for (const LayerRange& c : chunks) s.push_back({c.first + 1.0, 0, 0, 0});
    return s;
  };
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, Equal(4, 1, 9, 9, 9), o, 2, ScheduleKind::kInterleaved, 2, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::vector<LayerRange> rank0{{0, 1}, {2, 3}}, rank1{{1, 2}, {3, 4}};
  EXPECT_EQ(calls, (std::map<std::vector<LayerRange>, int>{{rank0, 2}, {rank1, 2}}));
  // Each micro-batch's F runs through chunks 0..3 (1, 2, 3, 4 s) one after another.
  EXPECT_GE(p->step_seconds, 1.0 + 2.0 + 3.0 + 4.0);
}

// A worker twice as fast takes half the time for the same layers; the cut follows the speeds.
TEST(PlannerTest, WorkerSpeedsScaleTheCostsAndTheCut) {
  const std::vector<double> flops(3, 1.0);
  PlannerOptions o = Options(2, 2);
  o.workers[0].gflops = 2;  // rank 0 takes two layers in the time rank 1 takes one.
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, Equal(3, 1, 1, 1, 1), o, 2, ScheduleKind::kGPipe, 1, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->boundaries, (std::vector<int>{0, 2, 3}));
  EXPECT_DOUBLE_EQ(p->imbalance, 1.0);
  // GPipe, M=2, both stages F=1, B=2: (M + S - 1) x (F + B) = 9.
  EXPECT_DOUBLE_EQ(p->step_seconds, 9.0);
}

// Two workers on one host of 1 CPU (`pipetrain local --stages 2` on a single core) each compute
// at half speed: the same 1F1B plan takes twice as long as on two hosts.
TEST(PlannerTest, WorkersSharingTooFewCpusSlowDown) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(4, 2);
  o.host_cpus = 1;
  absl::StatusOr<PlanChoice> shared =
      EvaluatePlan(flops, Equal(4, 1, 0.5, 0.5, 0.5), o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_DOUBLE_EQ(shared->step_seconds, 2 * 15.0);
  o.host_cpus = 2;  // one each: full speed.
  absl::StatusOr<PlanChoice> own =
      EvaluatePlan(flops, Equal(4, 1, 0.5, 0.5, 0.5), o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_DOUBLE_EQ(own->step_seconds, 15.0);
}

// On a host whose CPUs the workers fill, the coordinator's and the client's CPU seconds of the
// step (2 M tensors fed, 3 control messages per worker, 4 for the client's TrainStep) add to it,
// times the share of the step the workers compute (1 - the bubble: they take a CPU from a
// worker only while it computes). With a CPU to spare, or CPUs of their own, they do not.
TEST(PlannerTest, OnAFullHostTheCoordinatorsCpuAddsToTheStep) {
  EXPECT_DOUBLE_EQ(CoordinatorSeconds(16, 2, 0.5), (32 + 6 + 4) * 0.5);
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(4, 2);
  o.link.cpu_seconds_per_message = 0.01;
  const ModelCosts costs = Equal(4, 1, 0.5, 0.5, 0.5);
  absl::StatusOr<PlanChoice> apart =
      EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_EQ(apart->coordinator_seconds, 0);
  o.host_cpus = 2;
  absl::StatusOr<PlanChoice> full = EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_DOUBLE_EQ(full->bubble, apart->bubble);
  EXPECT_GT(full->bubble, 0.1);
  EXPECT_DOUBLE_EQ(full->coordinator_seconds, (2 * 4 + 3 * 2 + 4) * 0.01 * (1 - full->bubble));
  EXPECT_DOUBLE_EQ(full->step_seconds, apart->step_seconds + full->coordinator_seconds);
  o.host_cpus = 3;
  absl::StatusOr<PlanChoice> spare =
      EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(spare.ok()) << spare.status();
  EXPECT_EQ(spare->coordinator_seconds, 0);
  EXPECT_DOUBLE_EQ(spare->step_seconds, apart->step_seconds);
  // Two replicas of one stage fill the two CPUs as well, with no bubble: 2 x 4 fed, 3 x 2
  // control, 4.
  o.host_cpus = 2;
  absl::StatusOr<PlanChoice> replicas =
      EvaluatePlan(flops, costs, o, 1, ScheduleKind::kOneFOneB, 1, 4, 2);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_EQ(replicas->bubble, 0);
  EXPECT_DOUBLE_EQ(replicas->coordinator_seconds, (2 * 4 + 3 * 2 + 4) * 0.01);
}

std::map<int, ModelCosts> ProportionalCosts(int layers, int64_t batch, std::vector<int> ms,
                                            double per_sample, double out) {
  std::map<int, ModelCosts> by_m;
  for (int m : ms) {
    const int64_t samples = batch / m;
    by_m[m] = Equal(layers, samples, per_sample * samples, per_sample * samples,
                    per_sample * samples, 0, out);
  }
  return by_m;
}

// Messages of 1 MB over 100 kB/s take 10 s each, against 0.1 s of compute per layer: one stage
// wins. The same model over a free link splits across both workers.
TEST(PlannerTest, BandwidthStarvedLinkFavoursFewerStages) {
  const std::vector<double> flops(4, 1.0);
  const std::map<int, ModelCosts> by_m = ProportionalCosts(4, 4, {1, 2, 4}, 0.1 / 4, 1e6 / 4);
  PlannerOptions o = Options(4, 2, {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB});
  o.link.bytes_per_second = 1e5;
  absl::StatusOr<std::vector<PlanChoice>> starved = RankPlans(flops, by_m, o);
  ASSERT_TRUE(starved.ok()) << starved.status();
  EXPECT_EQ(starved->front().stages, 1) << PlanLabel(starved->front());
  o.link.bytes_per_second = 0;
  absl::StatusOr<std::vector<PlanChoice>> free = RankPlans(flops, by_m, o);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(free->front().stages, 2) << PlanLabel(free->front());
  EXPECT_EQ(free->front().microbatches, 4) << PlanLabel(free->front());
  for (size_t k = 1; k < free->size(); ++k) {
    EXPECT_GE((*free)[k - 1].samples_per_second, (*free)[k].samples_per_second * (1 - 1e-8));
  }
}

// Small micro-batches run less efficiently (0.3 s per layer-op for 1 sample against 0.4 s for 4),
// so without a memory limit 2 micro-batches win (S=2: 3 x 2.4 s against 9 x 1.8 s). A 1000-byte
// cap refuses every plan that stashes 1600 bytes on a rank (100 bytes per sample and layer):
// only 8 micro-batches under 1F1B (2 in flight on rank 0) fit, and the planner picks it.
TEST(PlannerTest, TightMemoryFavoursMoreMicrobatchesAndFewerInFlight) {
  const std::vector<double> flops(4, 1.0);
  std::map<int, ModelCosts> by_m;
  by_m[2] = Equal(4, 4, 0.4, 0.4, 0.4, 100);
  by_m[8] = Equal(4, 1, 0.3, 0.3, 0.3, 100);
  PlannerOptions o = Options(8, 2, {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB});
  absl::StatusOr<std::vector<PlanChoice>> loose = RankPlans(flops, by_m, o);
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_EQ(loose->front().microbatches, 2) << PlanLabel(loose->front());
  EXPECT_EQ(loose->front().stages, 2);
  EXPECT_DOUBLE_EQ(loose->front().step_seconds, 7.2);
  EXPECT_DOUBLE_EQ(loose->front().peak_memory_bytes[0], 1600);
  for (WorkerResources& w : o.workers) w.memory_bytes = 1000;
  absl::StatusOr<std::vector<PlanChoice>> tight = RankPlans(flops, by_m, o);
  ASSERT_TRUE(tight.ok()) << tight.status();
  const PlanChoice& best = tight->front();
  EXPECT_TRUE(best.fits_memory);
  EXPECT_EQ(best.microbatches, 8) << PlanLabel(best);
  EXPECT_EQ(best.kind, ScheduleKind::kOneFOneB) << PlanLabel(best);
  EXPECT_EQ(best.stages, 2);
  EXPECT_DOUBLE_EQ(best.peak_memory_bytes[0], 400);
  EXPECT_DOUBLE_EQ(best.step_seconds, 16.2);
  EXPECT_FALSE(tight->back().fits_memory);  // the rest are listed after, marked.
}

// Every runnable kind is tried; interleaved only where M is a multiple of S and each chunk has a
// layer; dualpipe (never run) is not; one stage only in one chunk (it has no bubble to fill).
TEST(PlannerTest, EnumeratesOnlyRunnablePlans) {
  const std::vector<double> flops(4, 1.0);
  absl::StatusOr<std::vector<PlanChoice>> plans =
      RankPlans(flops, ProportionalCosts(4, 4, {1, 2, 4}, 0.1, 0), Options(4, 2));
  ASSERT_TRUE(plans.ok()) << plans.status();
  bool interleaved = false;
  int one_stage = 0;
  for (const PlanChoice& p : *plans) {
    EXPECT_NE(p.kind, ScheduleKind::kDualPipe);
    EXPECT_LE(p.stages * p.virtual_stages, 4) << PlanLabel(p);
    if (p.kind == ScheduleKind::kInterleaved) {
      interleaved = true;
      EXPECT_EQ(p.microbatches % p.stages, 0) << PlanLabel(p);
    }
    if (p.stages == 1) {
      ++one_stage;
      EXPECT_EQ(p.virtual_stages, 1) << PlanLabel(p);
    }
  }
  EXPECT_TRUE(interleaved);
  EXPECT_GT(one_stage, 0);
}

TEST(PlannerTest, RefusesBadInput) {
  const std::vector<double> flops(4, 1.0);
  // 3 micro-batches of 1 sample do not make a batch of 4.
  std::map<int, ModelCosts> by_m;
  by_m[3] = Equal(4, 1, 1, 1, 1);
  EXPECT_EQ(RankPlans(flops, by_m, Options(4, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Costs for 3 layers of a 4-layer model.
  by_m.clear();
  by_m[4] = Equal(3, 1, 1, 1, 1);
  EXPECT_EQ(RankPlans(flops, by_m, Options(4, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  PlannerOptions no_workers = Options(4, 0);
  EXPECT_EQ(RankPlans(flops, ProportionalCosts(4, 4, {4}, 1, 0), no_workers).status().code(),
            absl::StatusCode::kInvalidArgument);
  PlannerOptions bad_link = Options(4, 2);
  bad_link.link.bytes_per_second = -1;
  absl::Status s = RankPlans(flops, ProportionalCosts(4, 4, {4}, 1, 0), bad_link).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bandwidth"), std::string::npos) << s;
  EXPECT_EQ(
      EvaluatePlan(flops, Equal(4, 1, 1, 1, 1), Options(4, 2), 3, ScheduleKind::kOneFOneB, 1, 4)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);  // 3 stages on 2 workers.
}

// `c` with `bytes` of weight gradient per layer.
ModelCosts WithGradients(ModelCosts c, double bytes) {
  for (LayerCost& l : c.layers) l.gradient_bytes = bytes;
  return c;
}

// 2 replicas x 2 stages of 1F1B, a step of 8 micro-batches: each replica runs 4, (4 + 2 - 1) x
// (F 1 + B 2) = 15 s; then each rank reduces its 2 layers' 200 gradient bytes over a 100 B/s
// link with no latency: 2 (R - 1) / R x 200 / 100 = 2 s. Rank 0 ends last (15 s): 17 s.
TEST(PlannerTest, ReplicasRunTheirShareThenReduceGradients) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(8, 4);
  o.link.bytes_per_second = 100;
  const ModelCosts costs = WithGradients(Equal(4, 1, 0.5, 0.5, 0.5), 100);
  absl::StatusOr<PlanChoice> p = EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 8, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->replicas, 2);
  EXPECT_EQ(p->microbatches, 8);
  EXPECT_DOUBLE_EQ(p->reduction_seconds, 2.0);
  EXPECT_DOUBLE_EQ(p->step_seconds, 17.0);
  EXPECT_DOUBLE_EQ(p->samples_per_second, 8 / 17.0);
  EXPECT_DOUBLE_EQ(p->bubble, 1.0 / 5);
  EXPECT_EQ(PlanLabel(*p), "2 replicas x 2 stages x 1 virtual, 1f1b, 8 micro-batches");
  // Each message of the reduction (2 log2 R = 2) costs the latency and the message CPU.
  o.link.latency_seconds = 0.25;
  o.link.cpu_seconds_per_message = 0;
  o.link.bytes_per_second = 0;
  p = EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 8, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->reduction_seconds, 0.5);
  // A replica's worker at half speed slows its rank in every replica (the step waits for it).
  o.link = {};
  o.workers[2].gflops = 0.5;  // replica 1, rank 0
  p = EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 8, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->boundaries, (std::vector<int>{0, 2, 4}));  // cut by replica 0's speeds.
  EXPECT_GT(p->step_seconds, 15.0);
}

// Workers joined by different links: three stages whose first boundary crosses a link of 0.5 s +
// 1000 bytes at 500 B/s (2.5 s a message) and whose second is free take 9 s of 1F1B compute +
// 2 x 2.5 = 14 s; with that link between every pair, 9 + 4 x 2.5 = 19 s. A rank's reduction
// crosses the link between its replicas' workers. Pair links of the wrong shape are refused.
TEST(PlannerTest, PairLinksPriceEachMessageByTheLinkItCrosses) {
  const std::vector<double> flops(3, 1.0);
  const ModelCosts costs = Equal(3, 1, 1, 1, 1, 0, 1000);
  PlannerOptions o = Options(1, 3);
  const LinkCosts slow{0.5, 500, 0};
  o.pair_links.assign(3, std::vector<LinkCosts>(3, LinkCosts{}));
  o.pair_links[0][1] = o.pair_links[1][0] = slow;
  absl::StatusOr<PlanChoice> mixed =
      EvaluatePlan(flops, costs, o, 3, ScheduleKind::kOneFOneB, 1, 1);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_DOUBLE_EQ(mixed->step_seconds, 14.0);
  o.pair_links.clear();
  o.link = slow;
  absl::StatusOr<PlanChoice> uniform =
      EvaluatePlan(flops, costs, o, 3, ScheduleKind::kOneFOneB, 1, 1);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  EXPECT_DOUBLE_EQ(uniform->step_seconds, 19.0);

  PlannerOptions r = Options(2, 2);
  r.pair_links.assign(2, std::vector<LinkCosts>(2, LinkCosts{}));
  r.pair_links[1][0].latency_seconds = 0.25;  // measured one way: the worse direction counts.
  absl::StatusOr<PlanChoice> reduced =
      EvaluatePlan(std::vector<double>(3, 1.0), costs, r, 1, ScheduleKind::kOneFOneB, 1, 2, 2);
  ASSERT_TRUE(reduced.ok()) << reduced.status();
  EXPECT_DOUBLE_EQ(reduced->reduction_seconds, 2 * 0.25);

  r.pair_links.pop_back();
  absl::StatusOr<PlanChoice> refused =
      EvaluatePlan(std::vector<double>(3, 1.0), costs, r, 1, ScheduleKind::kOneFOneB, 1, 2, 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "pair links for 1 workers; there are 2");
  r.pair_links = {{LinkCosts{}, LinkCosts{}}, {LinkCosts{0, -5, 0}, LinkCosts{}}};
  refused =
      EvaluatePlan(std::vector<double>(3, 1.0), costs, r, 1, ScheduleKind::kOneFOneB, 1, 2, 2);
  EXPECT_EQ(refused.status().message(),
            "the link from w1 to w0: latency must be in [0, 1e6] s and bandwidth 0 (infinite) or "
            "in [1e-3, 1e30] bytes/s, got 0 s and -5 bytes/s");
}

// The reduction sends and receives one message per round for each chunk a rank holds, and one
// per 4 MiB segment of a larger chunk: 2 replicas (2 rounds) of one stage at 0.1 s of CPU per
// message and free latency and bandwidth reduce one chunk in 2 x 2 x 0.1 s, two chunks in twice
// that, and one chunk of 10 MiB (3 segments) in three times.
TEST(PlannerTest, ReplicasReduceEveryChunkAndSegmentInMessagesOfTheirOwn) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(4, 2);
  o.link.cpu_seconds_per_message = 0.1;
  const ModelCosts costs = WithGradients(Equal(4, 1, 0.5, 0.5, 0.5), 1000);
  absl::StatusOr<PlanChoice> one =
      EvaluatePlan(flops, costs, o, 1, ScheduleKind::kOneFOneB, 1, 4, 2);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_DOUBLE_EQ(one->reduction_seconds, 0.4);
  absl::StatusOr<PlanChoice> two =
      EvaluatePlan(flops, costs, o, 1, ScheduleKind::kInterleaved, 2, 4, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_DOUBLE_EQ(two->reduction_seconds, 0.8);
  const ModelCosts large = WithGradients(Equal(4, 1, 0.5, 0.5, 0.5), 2.5 * (1 << 20));
  absl::StatusOr<PlanChoice> segmented =
      EvaluatePlan(flops, large, o, 1, ScheduleKind::kOneFOneB, 1, 4, 2);
  ASSERT_TRUE(segmented.ok()) << segmented.status();
  EXPECT_DOUBLE_EQ(segmented->reduction_seconds, 1.2);
}

// Four workers, 4 equal layers, a step of 8 micro-batches of 1F1B. Free gradients: 4 replicas of
// one stage (2 micro-batches of 6 s each: 12 s) beat 2 x 2 (15 s) and 1 x 4 ((8 + 3) x 1.5 =
// 16.5 s). Gradients of 1000 bytes per layer over 100 B/s: 4 x 1 pays 2 x 3/4 x 4000 / 100 = 60 s
// and 2 x 2 pays 20 s, so one pipeline of 4 stages wins. max_replicas 1 keeps R at 1.
TEST(PlannerTest, ReplicasWinWhenTheReductionIsCheap) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(8, 4, {ScheduleKind::kOneFOneB});
  o.max_replicas = 4;
  std::map<int, ModelCosts> by_m;
  by_m[8] = WithGradients(Equal(4, 1, 0.5, 0.5, 0.5), 1000);
  absl::StatusOr<std::vector<PlanChoice>> cheap = RankPlans(flops, by_m, o);
  ASSERT_TRUE(cheap.ok()) << cheap.status();
  EXPECT_EQ(cheap->front().replicas, 4) << PlanLabel(cheap->front());
  EXPECT_EQ(cheap->front().stages, 1);
  EXPECT_DOUBLE_EQ(cheap->front().step_seconds, 12.0);
  o.link.bytes_per_second = 100;
  absl::StatusOr<std::vector<PlanChoice>> dear = RankPlans(flops, by_m, o);
  ASSERT_TRUE(dear.ok()) << dear.status();
  EXPECT_EQ(dear->front().replicas, 1) << PlanLabel(dear->front());
  EXPECT_EQ(dear->front().stages, 4);
  EXPECT_DOUBLE_EQ(dear->front().step_seconds, 16.5);
  bool saw_two = false;
  for (const PlanChoice& p : *dear) {
    EXPECT_LE(p.replicas * p.stages, 4) << PlanLabel(p);
    if (p.replicas == 2 && p.stages == 2) {
      saw_two = true;
      EXPECT_DOUBLE_EQ(p.reduction_seconds, 20.0);
    }
  }
  EXPECT_TRUE(saw_two);
  o.max_replicas = 1;
  absl::StatusOr<std::vector<PlanChoice>> single = RankPlans(flops, by_m, o);
  ASSERT_TRUE(single.ok()) << single.status();
  for (const PlanChoice& p : *single) EXPECT_EQ(p.replicas, 1) << PlanLabel(p);
}

// A step of 6 micro-batches has a gradient tree of 2 leaves: 2 replicas share it, 4 do not.
TEST(PlannerTest, ReplicasOnlyWhereTheGradientTreeSupportsThem) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(6, 4, {ScheduleKind::kGPipe});
  o.max_replicas = 4;
  std::map<int, ModelCosts> by_m;
  by_m[6] = Equal(4, 1, 0.5, 0.5, 0.5);
  absl::StatusOr<std::vector<PlanChoice>> plans = RankPlans(flops, by_m, o);
  ASSERT_TRUE(plans.ok()) << plans.status();
  bool two = false;
  for (const PlanChoice& p : *plans) {
    EXPECT_LE(p.replicas, 2) << PlanLabel(p);
    two = two || p.replicas == 2;
  }
  EXPECT_TRUE(two);
  const absl::Status s = EvaluatePlan(flops, by_m[6], o, 1, ScheduleKind::kGPipe, 1, 6, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4 replicas cannot share a step of 6 micro-batches"),
            std::string::npos)
      << s;
  EXPECT_EQ(EvaluatePlan(flops, by_m[6], o, 3, ScheduleKind::kGPipe, 1, 6, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // 2 x 3 workers of 4.
}

// Equal FLOPs, but layer 0's ops take 3 s where the others take 1 s (an embedding or a layer norm
// runs far from the GEMM rate). Cut by FLOPs: layers {0, 1} | {2, 3}, 4 s against 2 s; GPipe of
// 2 micro-batches with free backwards takes 4 + 4 + 2 = 10 s. Cut by the measured costs: {0} |
// {1, 2, 3}, 3 s each: 9 s. The choice carries the costs the coordinator will cut by.
TEST(PlannerTest, PartitionByMeasuredLayerCosts) {
  const std::vector<double> flops(4, 1.0);
  ModelCosts costs = Equal(4, 1, 1, 0, 0);
  costs.layers[0].forward = 3;
  PlannerOptions o = Options(2, 2);
  absl::StatusOr<PlanChoice> by_flops =
      EvaluatePlan(flops, costs, o, 2, ScheduleKind::kGPipe, 1, 2);
  ASSERT_TRUE(by_flops.ok()) << by_flops.status();
  EXPECT_EQ(by_flops->boundaries, (std::vector<int>{0, 2, 4}));
  EXPECT_DOUBLE_EQ(by_flops->step_seconds, 10.0);
  EXPECT_TRUE(by_flops->layer_costs.empty());
  o.partition_by_layer_costs = true;
  absl::StatusOr<PlanChoice> measured =
      EvaluatePlan(flops, costs, o, 2, ScheduleKind::kGPipe, 1, 2);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->boundaries, (std::vector<int>{0, 1, 4}));
  EXPECT_DOUBLE_EQ(measured->step_seconds, 9.0);
  EXPECT_DOUBLE_EQ(measured->imbalance, 1.0);
  EXPECT_EQ(measured->layer_costs, (std::vector<double>{3e9, 1e9, 1e9, 1e9}));
  EXPECT_EQ(LayerPartitionCosts(costs), measured->layer_costs);
}

// Layers 0-1 and 2-3 are two kinds (say attention and MLP) of equal FLOPs and equal seconds on the
// planning machine (F = I = W = 1 s per micro-batch of one sample). `slow` ([w], empty: none)
// marks the workers that run the kind of layers `slow_layers` `factor` times slower than the
// planning machine, the other kind as fast: their measured seconds, at one sample.
std::vector<std::map<int64_t, ModelCosts>> Measured(const std::vector<bool>& slow, int first_slow,
                                                    int last_slow, double factor) {
  std::vector<std::map<int64_t, ModelCosts>> out;
  for (bool s : slow) {
    ModelCosts m = Equal(4, 1, 1, 1, 1);
    for (int l = first_slow; l < last_slow && s; ++l) {
      m.layers[l].forward *= factor;
      m.layers[l].backward_input *= factor;
      m.layers[l].backward_weight *= factor;
    }
    out.push_back({{1, m}});
  }
  return out;
}

// Two workers of equal GFLOP/s, the second 2x slower on layers 2-3 only. The GFLOP/s ratio sees
// twins: 1F1B over 2 stages of 4 micro-batches is (M + S - 1) x (F + B) = 5 x 6 = 30 s, better
// than one stage's 4 x 6 x 2 = 48 s. Costed by what each worker measured, rank 1's chunk (layers
// 2-3) takes F 4 s and B 8 s: the pipeline waits on it, as if those layers cost twice as much
// everywhere, and one stage on the first worker (48 s) is now the best plan.
TEST(PlannerTest, AWorkerSlowOnOneLayerKindIsCostedByItsOwnMeasurements) {
  const std::vector<double> flops(4, 1.0);
  const ModelCosts costs = Equal(4, 1, 1, 1, 1);
  PlannerOptions o = Options(4, 2, {ScheduleKind::kOneFOneB});
  absl::StatusOr<PlanChoice> twins =
      EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(twins.ok()) << twins.status();
  EXPECT_DOUBLE_EQ(twins->step_seconds, 30.0);
  std::map<int, ModelCosts> by_m{{4, costs}};
  absl::StatusOr<std::vector<PlanChoice>> by_speed = RankPlans(flops, by_m, o);
  ASSERT_TRUE(by_speed.ok()) << by_speed.status();
  EXPECT_EQ(by_speed->front().stages, 2);

  o.measured = Measured({false, true}, 2, 4, 2);
  absl::StatusOr<PlanChoice> profiled =
      EvaluatePlan(flops, costs, o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  EXPECT_EQ(profiled->boundaries, (std::vector<int>{0, 2, 4}));  // the coordinator's cut: FLOPs.
  // The same as planning twins with layers 2-3 twice as slow.
  ModelCosts doubled = costs;
  for (int l = 2; l < 4; ++l) doubled.layers[l] = Equal(1, 1, 2, 2, 2).layers[0];
  PlannerOptions twins_options = Options(4, 2, {ScheduleKind::kOneFOneB});
  absl::StatusOr<PlanChoice> expected =
      EvaluatePlan(flops, doubled, twins_options, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_DOUBLE_EQ(profiled->step_seconds, expected->step_seconds);
  EXPECT_GT(profiled->step_seconds, 48.0);
  absl::StatusOr<std::vector<PlanChoice>> ranked = RankPlans(flops, by_m, o);
  ASSERT_TRUE(ranked.ok()) << ranked.status();
  EXPECT_EQ(ranked->front().stages, 1);
  EXPECT_DOUBLE_EQ(ranked->front().step_seconds, 48.0);
}

// The worker slow on layers 0-1 holds only layers 2-3 in a 2-stage plan: its measurements say it
// runs them as the planning machine does, and the plan is the twins' closed form.
TEST(PlannerTest, AWorkerSlowOnlyOnLayersItDoesNotHoldKeepsThePlan) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(4, 2, {ScheduleKind::kOneFOneB});
  o.measured = Measured({false, true}, 0, 2, 2);
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, Equal(4, 1, 1, 1, 1), o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->step_seconds, 30.0);
}

// A worker's measurement differs from its GFLOP/s: the measurement wins where it exists (here at
// one sample per micro-batch), the GFLOP/s ratio elsewhere. The first worker registered 2 GFLOP/s
// against the planning machine's 1, but measured the planning machine's seconds: with 4
// micro-batches of one sample it runs at the measured seconds (5 x 6 = 30 s); with 2 micro-batches
// of 2 samples, which it did not time, at twice the planning machine's speed.
TEST(PlannerTest, MeasurementsReplaceTheSpeedRatioOnlyWhereTheyExist) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(4, 2, {ScheduleKind::kOneFOneB});
  o.workers[0].gflops = 2;
  o.workers[1].gflops = 2;
  o.measured = Measured({false, false}, 0, 0, 1);
  absl::StatusOr<PlanChoice> measured =
      EvaluatePlan(flops, Equal(4, 1, 1, 1, 1), o, 2, ScheduleKind::kOneFOneB, 1, 4);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_DOUBLE_EQ(measured->step_seconds, 30.0);
  absl::StatusOr<PlanChoice> by_speed =
      EvaluatePlan(flops, Equal(4, 2, 1, 1, 1), o, 2, ScheduleKind::kOneFOneB, 1, 2);
  ASSERT_TRUE(by_speed.ok()) << by_speed.status();
  EXPECT_DOUBLE_EQ(by_speed->step_seconds, 3 * 3.0);  // (M + S - 1) x (F + B) / 2.
}

TEST(PlannerTest, MeasurementsOfTheWrongShapeAreRefused) {
  const std::vector<double> flops(4, 1.0);
  PlannerOptions o = Options(4, 2, {ScheduleKind::kOneFOneB});
  o.measured = Measured({false}, 0, 0, 1);
  absl::StatusOr<PlanChoice> p =
      EvaluatePlan(flops, Equal(4, 1, 1, 1, 1), o, 2, ScheduleKind::kOneFOneB, 1, 4);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("measured costs for 1 workers; there are 2"),
            std::string::npos);
  o.measured = Measured({false, false}, 0, 0, 1);
  o.measured[1][1].layers.pop_back();
  p = EvaluatePlan(flops, Equal(4, 1, 1, 1, 1), o, 2, ScheduleKind::kOneFOneB, 1, 4);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("worker w1: measured costs at 1 samples have 3 layers"),
            std::string::npos);
}

}  // namespace
}  // namespace pipetrain::plan
