// Math throughput: pipetrain's Linear F / I / W and one full training step of the deep benchmark
// MLP, each beside raw OpenBLAS sgemm on the same shapes measured in the same run.
//
// Prints GFLOP/s and the ratio ours / sgemm for 1 and 2 threads. A ratio near 1 means the layer
// runs at BLAS speed; the choice between Eigen's own kernels and EIGEN_USE_BLAS is made from it
// (docs/performance.md).
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/math/gqa_attention.h"
#include "common/math/isa.h"
#include "common/math/kernels.h"
#include "common/model/grad_tree.h"
#include "common/model/model.h"
#include "common/model/reference_trainer.h"
#include "common/model/stage.h"
#include "common/util/heap_tuning.h"

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_corename(void);

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

// Best-of-`reps` seconds per call of `fn`, after one warm-up call; each rep runs `fn` until at
// least 50 ms have passed.
double SecondsPerCall(const std::function<void()>& fn, int reps = 5) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    int calls = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < 0.05);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

// SecondsPerCall in this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): what a shared, oversubscribed
// machine disturbs least (time the thread waits for a core is not counted).
double CpuSecondsPerCall(const std::function<void()>& fn, int reps = 5) {
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    int calls = 0;
    const double start = now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = now() - start;
    } while (elapsed < 0.05);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

// C[m,n] (+)= op(A) op(B) in row-major float32 through cblas.
struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k;
  float beta;
};

// Whether BenchLinear and SgemmSeconds time in thread CPU time (--peer-linear) instead of wall
// time.
bool g_cpu_time = false;

// SecondsPerCall or CpuSecondsPerCall, as g_cpu_time says.
double Timed(const std::function<void()>& fn) {
  return g_cpu_time ? CpuSecondsPerCall(fn) : SecondsPerCall(fn);
}

double SgemmSeconds(const Gemm& g) {
  std::vector<float> a(static_cast<size_t>(g.m) * g.k, 0.5f),
      b(static_cast<size_t>(g.k) * g.n, 0.25f), c(static_cast<size_t>(g.m) * g.n, 0.0f);
  const int lda = g.ta == CblasNoTrans ? g.k : g.m;
  const int ldb = g.tb == CblasNoTrans ? g.n : g.k;
  return Timed([&] {
    cblas_sgemm(CblasRowMajor, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb,
                g.beta, c.data(), g.n);
  });
}

void Row(const char* what, double flops, double ours, double ref) {
  std::printf("  %-34s %8.2f GFLOP/s   sgemm %8.2f GFLOP/s   ratio %.3f\n", what,
              flops / ours * 1e-9, flops / ref * 1e-9, ref / ours);
}

// The Linear layer of the process's default instruction-set level (math::KernelsFor), the code
// a job runs, not the plain math::Linear built at PIPETRAIN_ARCH.
void BenchLinear(int rows, int in, int out, int threads) {
  const math::Kernels& kernels = math::KernelsFor(math::DefaultIsa());
  kernels.ConfigureEigen(threads);
  const std::unique_ptr<math::Layer> made = kernels.MakeLinear(in, out, /*bias=*/true);
  const math::Layer& layer = *made;
  std::vector<math::Tensor> params;
  layer.Init(1, 0, &params);
  std::vector<math::Tensor> grads = params;
  math::Matrix x = math::Matrix::Constant(rows, in, 0.5f), y(rows, out),
               dy = math::Matrix::Constant(rows, out, 0.25f), dx(rows, in);
  math::Stash stash;
  const math::FlopCount f = layer.Flops(rows);
  const double tf =
      Timed([&] { layer.Forward(params, math::AsConstMap(x), math::AsMap(y), &stash); });
  const double ti = Timed([&] {
    layer.BackwardInput(params, math::AsConstMap(x), math::AsConstMap(dy), &stash, math::AsMap(dx));
  });
  // As a Stage runs them: the weight packed once (math::ParamCache) and reused by every call.
  const std::unique_ptr<math::ParamCache> cache = layer.NewParamCache();
  const double tf_cached = Timed([&] {
    layer.ForwardCached(params, cache.get(), math::AsConstMap(x), math::AsMap(y), &stash);
  });
  const double ti_cached = Timed([&] {
    layer.BackwardInputCached(params, cache.get(), math::AsConstMap(x), math::AsConstMap(dy),
                              &stash, math::AsMap(dx));
  });
  const double tw = Timed([&] {
    layer.BackwardWeight(params, math::AsConstMap(x), math::AsConstMap(dy), stash,
                         absl::MakeSpan(grads));
  });
  // The same products: y = x W^T, dx = dy W, dW += dy^T x.
  const double sf = SgemmSeconds({CblasNoTrans, CblasTrans, rows, out, in, 0.0f});
  const double si = SgemmSeconds({CblasNoTrans, CblasNoTrans, rows, in, out, 0.0f});
  const double sw = SgemmSeconds({CblasTrans, CblasNoTrans, out, in, rows, 1.0f});
  std::printf(" Linear rows=%d in=%d out=%d (%s)\n", rows, in, out,
              std::string(math::IsaName(kernels.isa())).c_str());
  Row("forward (F)", f.forward, tf, sf);
  Row("forward (F), weight packed once", f.forward, tf_cached, sf);
  Row("input gradient (I)", f.backward_input, ti, si);
  Row("input gradient (I), packed once", f.backward_input, ti_cached, si);
  Row("weight gradient (W)", f.backward_weight, tw, sw);
}

// The Linear products of the peer models (bench/gpt_peer.textproto, bench/llama_peer.textproto:
// d = 256, one micro-batch of 8 samples x context 128 = 1024 rows) beside OpenBLAS sgemm, one
// thread, thread CPU time: which GEMM is faster at these shapes on this machine.
int BenchPeerLinears() {
  g_cpu_time = true;
  Eigen::setNbThreads(1);
  openblas_set_num_threads(1);
  std::printf("threads=1, thread CPU time\n");
  const int rows = 1024;
  const struct {
    const char* what;
    int in, out;
  } shapes[] = {{"GPT attn.qkv", 256, 768},   {"GPT attn.proj, LLaMA attn.q/o", 256, 256},
                {"GPT mlp.fc", 256, 1024},    {"GPT mlp.proj", 1024, 256},
                {"LLaMA attn.k/v", 256, 128}, {"LLaMA mlp.gate/up", 256, 768},
                {"LLaMA mlp.down", 768, 256}};
  for (const auto& s : shapes) {
    std::printf("%s\n", s.what);
    BenchLinear(rows, s.in, s.out, 1);
  }
  return 0;
}

// Causal attention (gqa_attention.h) at the transformer peer's shapes (bench/gpt_peer.textproto:
// one micro-batch of 8 samples, context 128, 8 heads of 32), forward and backward, beside sgemm
// at the same GEMM FLOPs: the causal products only (CausalScoreEntries), rated at sgemm's speed on
// the T x T x hd products one head needs. Built at PIPETRAIN_ARCH (pipetrain_math_layers), not at
// the default level: the attention is not a layer of its own. The last line compares the whole
// attention (softmax included) with sgemm running the full-square products alone, as an
// attention that computes the masked half (PyTorch's) does.
void BenchAttention() {
  const int t = 128, heads = 8, hd = 32, samples = 8, rows = samples * t, d = heads * hd;
  const math::GqaShape shape{heads, heads, hd, t};
  const math::Matrix q = math::Matrix::Random(rows, d), k = math::Matrix::Random(rows, d),
                     v = math::Matrix::Random(rows, d), dout = math::Matrix::Random(rows, d);
  math::Matrix out(rows, d), dq(rows, d), dk(rows, d), dv(rows, d);
  std::vector<float> probs(static_cast<size_t>(math::GqaProbabilityFloats(shape, rows)));
  std::vector<float> scratch(static_cast<size_t>(t) * t);
  auto forward = [&] {
    math::GqaAttentionForward(shape, math::AsConstMap(q), math::AsConstMap(k), math::AsConstMap(v),
                              probs.data(), math::AsMap(out));
  };
  const double tf = SecondsPerCall(forward);
  const double tb = SecondsPerCall([&] {
    math::GqaAttentionBackward(shape, math::AsConstMap(q), math::AsConstMap(k), math::AsConstMap(v),
                               probs.data(), math::AsConstMap(dout), scratch.data(),
                               math::AsMap(dq), math::AsMap(dk), math::AsMap(dv));
  });
  // One head's full-square products: S = q k^T [T, T] (depth hd), O = P v (depth T).
  const double s_head = SgemmSeconds({CblasNoTrans, CblasTrans, t, t, hd, 0.0f}) +
                        SgemmSeconds({CblasNoTrans, CblasNoTrans, t, hd, t, 0.0f});
  const double full_head_flops = 2 * 2.0 * t * t * hd;
  const double sgemm_rate = full_head_flops / s_head;
  const double causal = math::CausalScoreEntries(t) * samples * heads;
  const double f_flops = 2 * 2.0 * causal * hd, b_flops = 4 * 2.0 * causal * hd;
  std::printf(
      " causal attention, %d samples x context %d, %d heads of %d (%s; %.0f of %d scores)\n",
      samples, t, heads, hd, PIPETRAIN_ARCH_NAME, math::CausalScoreEntries(t), t * t);
  Row("forward (F), GEMM FLOPs", f_flops, tf, f_flops / sgemm_rate);
  Row("backward (I), GEMM FLOPs", b_flops, tb, b_flops / sgemm_rate);
  const double full_f = s_head * samples * heads;
  std::printf("  %-34s %8.3f ms   sgemm full square %8.3f ms   ratio %.3f\n",
              "forward incl. softmax", tf * 1e3, full_f * 1e3, full_f / tf);
  std::printf("  %-34s %8.3f ms   sgemm full square %8.3f ms   ratio %.3f\n",
              "backward incl. softmax", tb * 1e3, 2 * full_f * 1e3, 2 * full_f / tb);
}

// Backward as one action per micro-batch (B: BackwardInput then BackwardWeight at once, as GPipe,
// 1F1B and interleaved run it) against the split the zero-bubble schedules run (every
// micro-batch's I first, its W later), over `m` micro-batches of `rows` rows whose forwards ran
// once. Same calls, same FLOPs: the ratio shows what deferring W costs in cache misses and stash
// traffic. Prints t(split) / t(B).
void BenchSplitBackward(const char* what, const math::Layer& layer, int64_t rows, int m) {
  std::vector<math::Tensor> params;
  layer.Init(1, 0, &params);
  std::vector<math::Tensor> grads = params;
  const int64_t in = layer.in_features(), out = layer.out_features();
  std::vector<math::Matrix> x, y, dy, dx;
  std::vector<math::Stash> stash(static_cast<size_t>(m));
  for (int mb = 0; mb < m; ++mb) {
    x.push_back(math::Matrix::Constant(rows, in, 0.01f * static_cast<float>(mb + 1)));
    y.emplace_back(rows, out);
    dy.push_back(math::Matrix::Constant(rows, out, 0.001f * static_cast<float>(mb + 1)));
    dx.emplace_back(rows, in);
    layer.Forward(params, math::AsConstMap(x[mb]), math::AsMap(y[mb]), &stash[mb]);
  }
  auto input = [&](int mb) {
    layer.BackwardInput(params, math::AsConstMap(x[mb]), math::AsConstMap(dy[mb]), &stash[mb],
                        math::AsMap(dx[mb]));
  };
  auto weight = [&](int mb) {
    layer.BackwardWeight(params, math::AsConstMap(x[mb]), math::AsConstMap(dy[mb]), stash[mb],
                         absl::MakeSpan(grads));
  };
  const double fused = SecondsPerCall([&] {
    for (int mb = 0; mb < m; ++mb) {
      input(mb);
      weight(mb);
    }
  });
  const double split = SecondsPerCall([&] {
    for (int mb = 0; mb < m; ++mb) input(mb);
    for (int mb = 0; mb < m; ++mb) weight(mb);
  });
  const math::FlopCount f = layer.Flops(rows);
  std::printf("  %-40s B %8.3f ms  I..W %8.3f ms  split/B %.3f  (%.2f GFLOP/s as B)\n", what,
              fused * 1e3, split * 1e3, split / fused,
              m * (f.backward_input + f.backward_weight) / fused * 1e-9);
}

void BenchSplitBackwards() {
  const math::Kernels& k = math::KernelsFor(math::DefaultIsa());
  k.ConfigureEigen(Eigen::nbThreads());
  constexpr int kM = 8;
  std::printf(" backward: B (I then W per micro-batch) vs split (all I, then all W), M=%d, %s\n",
              kM, std::string(math::IsaName(k.isa())).c_str());
  BenchSplitBackward("Linear 512->512, 32 rows", *k.MakeLinear(512, 512, true), 32, kM);
  BenchSplitBackward("Linear 1024->1024, 256 rows", *k.MakeLinear(1024, 1024, true), 256, kM);
  BenchSplitBackward("ReLU 512, 32 rows", *k.MakeRelu(512), 32, kM);
  BenchSplitBackward("GELU 512, 256 rows", *k.MakeGelu(512), 256, kM);
  BenchSplitBackward("LayerNorm 512, 256 rows", *k.MakeLayerNorm(512, 1e-5f), 256, kM);
  BenchSplitBackward("TransformerBlock d=128 h=4 ctx=32, 256 rows",
                     *k.MakeTransformerBlock(128, 4, 32, 4), 256, kM);
}

int BenchMlpStep(const std::string& spec_path) {
  auto spec = model::LoadModelSpecFile(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  auto net = model::Model::Build(*spec);
  if (!net.ok()) {
    std::fprintf(stderr, "%s\n", std::string(net.status().message()).c_str());
    return 1;
  }
  const int64_t batch = 256, m = 4;
  model::TrainerOptions o;
  o.microbatches = m;
  o.threads = Eigen::nbThreads();
  o.optimizer.kind = math::OptimizerKind::kSgd;
  o.optimizer.lr = 1e-3f;
  auto trainer = model::ReferenceTrainer::Create(net->get(), o);
  if (!trainer.ok()) return 1;
  io::Batch b;
  b.samples = batch;
  b.inputs = math::Matrix::Constant(batch, (*net)->input_features(), 0.1f);
  b.targets = math::Matrix::Zero(batch, 1);
  double flops = 0;
  for (double f : (*net)->LayerFlops(batch)) flops += f;
  const double t = SecondsPerCall([&] { (void)(*trainer)->Step(b); }, 3);
  // Reference: the three GEMMs of one 512x512 hidden layer on one micro-batch, per FLOP.
  const int rows = static_cast<int>(batch / m);
  const double gemm_flops = 3 * 2.0 * rows * 512 * 512;
  const double sgemm = SgemmSeconds({CblasNoTrans, CblasTrans, rows, 512, 512, 0.0f}) +
                       SgemmSeconds({CblasNoTrans, CblasNoTrans, rows, 512, 512, 0.0f}) +
                       SgemmSeconds({CblasTrans, CblasNoTrans, 512, 512, rows, 1.0f});
  std::printf(" deep MLP training step (B=%lld, M=%lld, %s)\n", static_cast<long long>(batch),
              static_cast<long long>(m), spec_path.c_str());
  Row("full step (F+I+W+loss+optimizer)", flops, t, sgemm * flops / gemm_flops);
  return 0;
}

// One training step of `model` on a Stage over all its layers (F, I, W of m micro-batches of
// `rows` rows in 1F1B's per-stage order, then the optimizer), its gradients added in the canonical
// tree's order or, with `tree` null, in increasing order (a Stage that was never given a tree:
// what every stage did before the tree), with the default deferral of W (`defer` false: every W
// added at once, defer 0).
double StageStepSeconds(const model::Model& net, const model::GradTree* tree, bool defer,
                        int64_t rows, int64_t m) {
  math::OptimizerConfig sgd;
  sgd.kind = math::OptimizerKind::kSgd;
  sgd.lr = 1e-3f;
  auto stage = model::Stage::Create(&net, 0, net.num_layers(), 1, sgd);
  if (!stage.ok()) return 0;
  if (tree != nullptr && !stage->SetGradTree(*tree).ok()) return 0;
  if (!defer) stage->set_weight_grad_defer_bytes(0);
  const math::Matrix x = math::Matrix::Constant(rows, net.input_features(), 0.1f);
  const math::Matrix dy = math::Matrix::Constant(rows, net.output_features(), 1e-3f);
  std::vector<model::MicrobatchState> states(static_cast<size_t>(m));
  int64_t step = 0;
  return CpuSecondsPerCall([&] {
    for (int64_t i = 0; i < m; ++i) {
      stage->Forward(math::AsConstMap(x), &states[i]);
      stage->BackwardInput(math::AsConstMap(dy), false, &states[i]);
      stage->BackwardWeight(&states[i]);
    }
    (void)stage->GradNormSqPerLayer();
    stage->ApplyOptimizer(++step, 1.0f);
  });
}

// The canonical gradient tree's cost on the deep MLP (B = 256, M = 8, as bench/peer_bench.sh):
// a step with the tree over one in increasing order, interleaved round by round, best of 7 rounds
// in thread CPU time; and one Linear's W of that step alone.
void BenchGradTree(const model::Model& net) {
  constexpr int64_t kM = 8, kRows = 256 / kM;
  constexpr int kRounds = 7;
  auto tree = model::GradTree::Create(kM);
  if (!tree.ok()) return;
  std::printf(" gradient tree vs increasing order: deep MLP step, B=256, M=%lld\n",
              static_cast<long long>(kM));
  // One Linear's W of the step: the eight micro-batches added in increasing order in one pass
  // (BackwardWeightMany) against the tree's node (BackwardWeightNode).
  {
    const math::Kernels& k = net.kernels();
    const std::unique_ptr<math::Layer> linear = k.MakeLinear(512, 512, true);
    std::vector<math::Tensor> params;
    linear->Init(1, 0, &params);
    std::vector<math::Tensor> grads = params;
    std::vector<math::Matrix> xs, dys;
    std::vector<math::WeightGradInputs> inputs;
    math::Stash stash;
    for (int64_t i = 0; i < kM; ++i) {
      xs.push_back(math::Matrix::Constant(kRows, 512, 0.01f * static_cast<float>(i + 1)));
      dys.push_back(math::Matrix::Constant(kRows, 512, 0.001f * static_cast<float>(i + 1)));
    }
    for (int64_t i = 0; i < kM; ++i) {
      inputs.push_back({math::AsConstMap(xs[i]), math::AsConstMap(dys[i]), &stash});
    }
    double in_order = 1e30, with_tree = 1e30;
    for (int round = 0; round < kRounds; ++round) {
      in_order = std::min(in_order, CpuSecondsPerCall([&] {
                            linear->BackwardWeightMany(params, inputs, absl::MakeSpan(grads));
                          }));
      with_tree =
          std::min(with_tree, CpuSecondsPerCall([&] {
                     (void)linear->BackwardWeightNode(params, inputs, 1, absl::MakeSpan(grads));
                   }));
    }
    std::printf("  %-28s increasing %8.3f ms  tree %8.3f ms  tree/increasing %.3f\n",
                "Linear 512x512 W of 8 x 32", in_order * 1e3, with_tree * 1e3,
                with_tree / in_order);
  }
  for (bool defer : {true, false}) {
    double in_order = 1e30, with_tree = 1e30;
    for (int round = 0; round < kRounds; ++round) {
      in_order = std::min(in_order, StageStepSeconds(net, nullptr, defer, kRows, kM));
      with_tree = std::min(with_tree, StageStepSeconds(net, &*tree, defer, kRows, kM));
    }
    std::printf("  %-28s increasing %8.3f ms  tree %8.3f ms  tree/increasing %.3f\n",
                defer ? "W deferred (default)" : "W added one by one", in_order * 1e3,
                with_tree * 1e3, with_tree / in_order);
  }
}

int BenchGradTreeOnly(const std::string& spec_path) {
  auto spec = model::LoadModelSpecFile(spec_path);
  if (!spec.ok()) return 1;
  auto net = model::Model::Build(*spec);
  if (!net.ok()) return 1;
  (*net)->kernels().ConfigureEigen(1);
  BenchGradTree(**net);
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  // As every pipetrain process does (common/util/heap_tuning.h); applies to sgemm too.
  if (absl::Status s = pipetrain::util::KeepLargeBuffersOnHeap(); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  }
  // --grad-tree [SPEC]: only the gradient tree's cost (BenchGradTree), one thread.
  if (argc > 1 && std::string(argv[1]) == "--grad-tree") {
    return pipetrain::BenchGradTreeOnly(
        argc > 2 ? argv[2] : PIPETRAIN_SOURCE_DIR "/examples/deep_mlp.textproto");
  }
  // --peer-linear: only the peer models' Linear shapes (BenchPeerLinears).
  if (argc > 1 && std::string(argv[1]) == "--peer-linear") {
    std::printf(
        "OpenBLAS core: %s%s\n", openblas_get_corename(),
        std::getenv("OPENBLAS_CORETYPE") ? " (from OPENBLAS_CORETYPE)" : " (auto-detected)");
    return pipetrain::BenchPeerLinears();
  }
  const std::string spec = argc > 1 ? argv[1] : PIPETRAIN_SOURCE_DIR "/examples/deep_mlp.textproto";
#ifdef EIGEN_USE_BLAS
  std::printf("pipetrain math: EIGEN_USE_BLAS (products through OpenBLAS)\n");
#else
  std::printf("pipetrain math: Eigen's own kernels\n");
#endif
  // OpenBLAS picks its kernels by CPU model at run time; on virtual machines with a generic CPU
  // model it may fall back to an old core (e.g. Prescott) and understate sgemm. Set
  // OPENBLAS_CORETYPE (e.g. SkylakeX, Haswell) to the real core for a fair reference.
  std::printf("OpenBLAS core: %s%s\n", openblas_get_corename(),
              std::getenv("OPENBLAS_CORETYPE") ? " (from OPENBLAS_CORETYPE)" : " (auto-detected)");
  for (int threads : {1, 2}) {
    Eigen::setNbThreads(threads);
    openblas_set_num_threads(threads);
    std::printf("threads=%d\n", threads);
    pipetrain::BenchLinear(64, 512, 512, threads);
    pipetrain::BenchLinear(256, 1024, 1024, threads);
    if (int rc = pipetrain::BenchMlpStep(spec); rc != 0) return rc;
    if (threads == 1) pipetrain::BenchSplitBackwards();
    pipetrain::BenchAttention();
  }
  return 0;
}
