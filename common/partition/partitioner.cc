#include "common/partition/partitioner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace pipetrain::partition {
namespace {

using schedule::Placement;
using schedule::PlacementKind;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Largest S*L^3 for the V-shape search with memory caps (about a second per 1e8 on one core).
constexpr double kMaxVShapeMemoryWork = 2e8;
// Largest S*L^2 for the V-shape search without caps (64 probes of it; tables of S*L^2 bytes).
constexpr double kMaxVShapeWork = 6e7;

// Validated inputs with prefix sums. Layer x's cut ("before layer x") has time bt[x]; bt[0] and
// bt[L] are 0.
struct Problem {
  int layers = 0;
  Placement placement;
  std::vector<double> cost_prefix;    // L+1
  std::vector<double> memory_prefix;  // L+1, whole bytes (each layer's rounded up; zeros without)
  std::vector<double> speed;          // S
  std::vector<double> cap;            // S, whole bytes (rounded down; infinite without caps)
  std::vector<double> bt;             // L+1
  bool has_caps = false;

  int stages() const { return placement.stages; }
  int chunks() const { return placement.num_chunks(); }
  double Cost(int i, int j) const { return cost_prefix[j] - cost_prefix[i]; }
  double Memory(int i, int j) const { return memory_prefix[j] - memory_prefix[i]; }
};

// INVALID_ARGUMENT "<what> <i> must be in <range> (got x)" for the first entry outside [lo, hi]
// (NaN included); `range` spells [lo, hi] for the message ("" for "[lo, hi]").
absl::Status CheckVector(const std::vector<double>& values, const char* what, double lo, double hi,
                         absl::string_view range = "") {
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    if (!(x >= lo && x <= hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, " must be in ",
                       range.empty() ? absl::StrCat("[", lo, ", ", hi, "]") : std::string(range),
                       " (got ", x, ")"));
    }
  }
  return absl::OkStatus();
}

constexpr char kMemoryRange[] = "[0, 2^53] bytes";

}  // namespace

absl::Status CheckLayersCoverChunks(int64_t layers, int64_t stages, int64_t virtual_stages) {
  // In 64 bits: S x V can exceed the int range that Placement::num_chunks() computes in.
  const int64_t chunks = stages * virtual_stages;
  if (layers >= chunks) return absl::OkStatus();
  // What would fit, each as the words after "use".
  std::vector<std::string> fixes;
  const int64_t fitting = virtual_stages > 0 ? layers / virtual_stages : 0;
  if (fitting == 1) fixes.push_back("1 stage");
  if (fitting > 1) fixes.push_back(absl::StrCat(fitting, " stages or fewer"));
  // Interleaved schedules take any V >= 2.
  const int64_t fitting_virtual = stages > 0 ? layers / stages : 0;
  if (virtual_stages > 2 && fitting_virtual >= 2) {
    fixes.push_back(absl::StrCat(fitting_virtual, " virtual stages or fewer"));
  }
  if (virtual_stages > 1 && layers >= 1) {
    fixes.push_back(absl::StrCat("a schedule with one chunk per stage (gpipe, 1f1b, zb-h1; up to ",
                                 layers, layers == 1 ? " stage)" : " stages)"));
  }
  fixes.push_back(absl::StrCat("a model with at least ", chunks, " layers"));
  std::string fix = "use " + fixes.front();
  for (size_t i = 1; i < fixes.size(); ++i) {
    absl::StrAppend(&fix, i + 1 == fixes.size() ? ", or " : ", ", fixes[i]);
  }
  std::string what = absl::StrCat(stages, stages == 1 ? " stage" : " stages");
  if (virtual_stages > 1) absl::StrAppend(&what, " x ", virtual_stages, " virtual stages");
  return absl::InvalidArgumentError(absl::StrCat(
      "the model has ", layers, layers == 1 ? " layer" : " layers", ", fewer than the ", chunks,
      " chunks of ", what, " (every chunk needs a layer): ", fix));
}

namespace {

absl::StatusOr<Problem> MakeProblem(const std::vector<double>& costs, const PartitionOptions& o) {
  PT_ASSIGN_OR_RETURN(Placement placement,
                      schedule::MakePlacement(o.placement, o.stages, o.virtual_stages));
  if (placement.kind == PlacementKind::kBidirectional) {
    return absl::InvalidArgumentError(
        "the bidirectional placement (dualpipe) holds two copies of each of S stages; cut the "
        "stages with the linear placement (kind 1f1b) instead");
  }
  if (costs.empty()) return absl::InvalidArgumentError("no layer costs given");
  if (costs.size() > static_cast<size_t>(kMaxLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", costs.size(), " layers; at most ", kMaxLayers, " are supported"));
  }
  PT_RETURN_IF_ERROR(CheckVector(costs, "cost of layer", 0.0, kMaxLayerCost));
  const int l = static_cast<int>(costs.size());
  const int s = placement.stages;
  PT_RETURN_IF_ERROR(CheckLayersCoverChunks(l, placement.stages, placement.virtual_stages));
  if (!o.speeds.empty() && static_cast<int>(o.speeds.size()) != s) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", o.speeds.size(), " speeds for ", s, " ranks"));
  }
  PT_RETURN_IF_ERROR(CheckVector(o.speeds, "speed of rank", kMinSpeed, kMaxSpeed));
  if (!o.memory_caps.empty() && static_cast<int>(o.memory_caps.size()) != s) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", o.memory_caps.size(), " memory caps for ", s, " ranks"));
  }
  PT_RETURN_IF_ERROR(
      CheckVector(o.memory_caps, "memory cap of rank", 0.0, kMaxMemoryBytes, kMemoryRange));
  if (!o.memory_caps.empty() && o.layer_memory.empty()) {
    return absl::InvalidArgumentError("memory caps need the memory of every layer");
  }
  if (!o.layer_memory.empty() && static_cast<int>(o.layer_memory.size()) != l) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", o.layer_memory.size(), " layer memory sizes for ", l, " layers"));
  }
  PT_RETURN_IF_ERROR(
      CheckVector(o.layer_memory, "memory of layer", 0.0, kMaxMemoryBytes, kMemoryRange));
  // Whole bytes, rounded up; their total must stay exact too.
  double total_memory = 0;
  for (double m : o.layer_memory) total_memory += std::ceil(m);
  if (total_memory > kMaxMemoryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the ", l, " layers' memory totals ",
                                                   absl::StrFormat("%.0f", total_memory),
                                                   " bytes, more than 2^53"));
  }
  if (!o.boundary_times.empty() && static_cast<int>(o.boundary_times.size()) != l - 1) {
    return absl::InvalidArgumentError(absl::StrCat("got ", o.boundary_times.size(),
                                                   " boundary times for ", l - 1,
                                                   " cut positions (layers - 1)"));
  }
  PT_RETURN_IF_ERROR(
      CheckVector(o.boundary_times, "boundary time after layer", 0.0, kMaxBoundaryTime));

  Problem p;
  p.layers = l;
  p.placement = placement;
  p.cost_prefix.assign(l + 1, 0.0);
  p.memory_prefix.assign(l + 1, 0.0);
  for (int i = 0; i < l; ++i) {
    p.cost_prefix[i + 1] = p.cost_prefix[i] + costs[i];
    // Whole bytes below 2^53 (checked above): every prefix sum and difference is exact.
    p.memory_prefix[i + 1] =
        p.memory_prefix[i] + (o.layer_memory.empty() ? 0.0 : std::ceil(o.layer_memory[i]));
  }
  p.speed = o.speeds.empty() ? std::vector<double>(s, 1.0) : o.speeds;
  p.has_caps = !o.memory_caps.empty();
  p.cap.assign(s, kInf);
  for (int w = 0; w < s && p.has_caps; ++w) p.cap[w] = std::floor(o.memory_caps[w]);
  p.bt.assign(l + 1, 0.0);
  for (int x = 1; x < l && !o.boundary_times.empty(); ++x) p.bt[x] = o.boundary_times[x - 1];
  return p;
}

// Whether the cut at boundary index c (between chunks c-1 and c) costs transfer time.
bool CutIsRemote(const Placement& placement, int c) {
  return c > 0 && c < placement.num_chunks() && placement.OwnerOf(c - 1) != placement.OwnerOf(c);
}

// The figures of boundaries `b` by direct summation.
Partition Evaluate(const std::vector<double>& costs, const Problem& p, const std::vector<int>& b,
                   const std::vector<double>& layer_memory) {
  Partition out;
  out.placement = p.placement;
  out.boundaries = b;
  const int s = p.stages();
  const int c_count = p.chunks();
  out.chunk_cost.assign(c_count, 0.0);
  out.worker_cost.assign(s, 0.0);
  out.worker_time.assign(s, 0.0);
  out.worker_memory.assign(s, 0.0);
  std::vector<double> transfer(s, 0.0);
  for (int c = 0; c < c_count; ++c) {
    const int w = p.placement.OwnerOf(c);
    for (int x = b[c]; x < b[c + 1]; ++x) {
      out.chunk_cost[c] += costs[x];
      if (!layer_memory.empty()) out.worker_memory[w] += layer_memory[x];
    }
    out.worker_cost[w] += out.chunk_cost[c];
    if (CutIsRemote(p.placement, c)) {
      transfer[w] += p.bt[b[c]];
      transfer[p.placement.OwnerOf(c - 1)] += p.bt[b[c]];
    }
  }
  double sum = 0;
  for (int w = 0; w < s; ++w) {
    out.worker_time[w] = out.worker_cost[w] / p.speed[w] + transfer[w];
    sum += out.worker_time[w];
    if (out.worker_time[w] > out.bottleneck) {
      out.bottleneck = out.worker_time[w];
      out.bottleneck_worker = w;
    }
  }
  // bottleneck / mean, which is in [1, S] exactly. Tiny (subnormal) times lose their precision
  // in the mean (or round it to 0): their ratio is taken after an exact scaling by 2^600. Rounding
  // is clamped into the range.
  double bottleneck = out.bottleneck;
  if (sum > 0 && sum < 0x1p-900) {
    bottleneck *= 0x1p600;
    sum *= 0x1p600;
  }
  out.imbalance = sum > 0 ? std::clamp(bottleneck / (sum / s), 1.0, static_cast<double>(s)) : 1.0;
  return out;
}

// Byte counts in messages: exact when integral ("2170880"), else %g.
std::string Bytes(double x) {
  if (x == std::floor(x) && std::abs(x) < 1e15) return absl::StrFormat("%.0f", x);
  return absl::StrFormat("%g", x);
}

// RESOURCE_EXHAUSTED explaining why no cut fits the memory caps. Without caps every cut fits, so
// a search that found none has a bug: INTERNAL.
absl::Status MemoryInfeasible(const Problem& p, const std::string& note) {
  if (!p.has_caps) {
    return absl::InternalError(absl::StrCat("the partitioner found no cut of ", p.layers,
                                            " layers into ", p.chunks(),
                                            " chunks without memory caps (a bug)"));
  }
  double cap_sum = 0;
  double cap_max = 0;
  for (double c : p.cap) {
    cap_sum += c;
    cap_max = std::max(cap_max, c);
  }
  for (int x = 0; x < p.layers; ++x) {
    const double memory = p.memory_prefix[x + 1] - p.memory_prefix[x];
    if (memory > cap_max) {
      return absl::ResourceExhaustedError(
          absl::StrCat("memory caps infeasible: layer ", x, " needs ", Bytes(memory),
                       " bytes, more than the largest cap (", Bytes(cap_max), ")"));
    }
  }
  const double total = p.memory_prefix[p.layers];
  if (total > cap_sum) {
    return absl::ResourceExhaustedError(absl::StrCat("memory caps infeasible: the ", p.layers,
                                                     " layers need ", Bytes(total),
                                                     " bytes; the caps sum to ", Bytes(cap_sum)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("memory caps infeasible: no contiguous cut of ", p.layers, " layers into ",
                   p.chunks(), " chunks (", schedule::PlacementKindName(p.placement.kind),
                   " placement) keeps every rank "
                   "within its cap",
                   note));
}

// Chain DP over the chunks in model order where chunk c runs at its owner's speed, is charged the
// transfer time of its remote cuts and must fit `chunk_cap[c]`. Minimises the largest chunk time,
// then the sum of squared chunk times among the optimal cuts. For the linear placement chunk
// time is worker time, so this is the exact partitioner. Returns boundaries, or empty if nothing
// fits the caps.
std::vector<int> ChainPartition(const Problem& p, const std::vector<double>& chunk_cap) {
  const int l = p.layers;
  const int c_count = p.chunks();
  auto time = [&](int c, int i, int j) {
    const double speed = p.speed[p.placement.OwnerOf(c)];
    double t = p.Cost(i, j) / speed;
    if (CutIsRemote(p.placement, c)) t += p.bt[i];
    if (CutIsRemote(p.placement, c + 1)) t += p.bt[j];
    return t;
  };
  const size_t width = static_cast<size_t>(l) + 1;
  // best[k * width + j]: smallest bottleneck of chunks 0..k-1 covering layers [0, j).
  std::vector<double> best((c_count + 1) * width, kInf);
  best[0] = 0;
  for (int k = 1; k <= c_count; ++k) {
    for (int j = k; j <= l - (c_count - k); ++j) {
      double& out = best[k * width + j];
      const double speed = p.speed[p.placement.OwnerOf(k - 1)];
      for (int i = j - 1; i >= k - 1; --i) {
        if (p.Memory(i, j) > chunk_cap[k - 1]) break;
        if (p.Cost(i, j) / speed >= out) break;  // Grows as i falls; transfers only add.
        const double prev = best[(k - 1) * width + i];
        if (prev == kInf) continue;
        out = std::min(out, std::max(prev, time(k - 1, i, j)));
      }
    }
  }
  const double target = best[c_count * width + l];
  if (target == kInf) return {};
  // Among cuts with every chunk time <= target, the smallest sum of squares.
  std::vector<double> squares((c_count + 1) * width, kInf);
  std::vector<int> from((c_count + 1) * width, -1);
  squares[0] = 0;
  for (int k = 1; k <= c_count; ++k) {
    const double speed = p.speed[p.placement.OwnerOf(k - 1)];
    for (int j = k; j <= l - (c_count - k); ++j) {
      for (int i = j - 1; i >= k - 1; --i) {
        if (p.Memory(i, j) > chunk_cap[k - 1]) break;
        if (p.Cost(i, j) / speed > target) break;
        const double prev = squares[(k - 1) * width + i];
        if (prev == kInf) continue;
        const double t = time(k - 1, i, j);
        if (t > target) continue;
        const double value = prev + t * t;
        if (value < squares[k * width + j]) {
          squares[k * width + j] = value;
          from[k * width + j] = i;
        }
      }
    }
  }
  std::vector<int> b(c_count + 1);
  b[c_count] = l;
  for (int k = c_count; k >= 1; --k) {
    const int i = from[k * width + b[k]];
    // Cannot happen within the input ranges (every time and square is finite); guards the index.
    if (i < 0) return {};
    b[k - 1] = i;
  }
  return b;
}

// Exact search for the V-shape placement (see the header). Rank k takes [a, a') and [b', b)
// from the middle range [a, b) left by ranks 0..k-1; rank S-1 takes all of [a, b).
class VShapeSearch {
 public:
  explicit VShapeSearch(const Problem& p)
      : p_(p), s_(p.stages()), l_(p.layers), width_(static_cast<size_t>(p.layers) + 1) {
    feasible_.assign(s_, std::vector<uint8_t>(width_ * width_, 0));
  }

  // Rank k's time for its outer cuts a, b: the part of its time that depends on them.
  double Outer(int k, int a, int b) const {
    return (p_.cost_prefix[b] - p_.cost_prefix[a]) / p_.speed[k] + p_.bt[a] + p_.bt[b];
  }
  // The part that depends on its inner cuts a', b' (k < S-1).
  double Inner(int k, int a2, int b2) const {
    return (p_.cost_prefix[a2] - p_.cost_prefix[b2]) / p_.speed[k] + p_.bt[a2] + p_.bt[b2];
  }
  bool Fits(int k, double memory) const { return memory <= p_.cap[k]; }

  // Fills the feasibility tables for bottleneck `t`; true if the whole model fits.
  bool Feasible(double t) {
    for (int k = s_ - 1; k >= 0; --k) {
      std::vector<uint8_t>& f = feasible_[k];
      std::fill(f.begin(), f.end(), 0);
      const int need = 2 * (s_ - k);  // Layers ranks k..S-1 need at least.
      if (k == s_ - 1) {
        for (int a = k; a <= l_ - k; ++a) {
          for (int b = a + need; b <= l_ - k; ++b) {
            f[a * width_ + b] = Outer(k, a, b) <= t && Fits(k, p_.Memory(a, b));
          }
        }
      } else if (!p_.has_caps) {
        FillWithoutCaps(k, t);
      } else {
        FillWithCaps(k, t);
      }
    }
    return feasible_[0][0 * width_ + l_] != 0;
  }

  // Boundaries of a cut achieving bottleneck `t` (Feasible(t) must have returned true).
  std::vector<int> Reconstruct(double t) const {
    const int c_count = 2 * s_;
    std::vector<int> b(c_count + 1);
    int a = 0;
    int z = l_;
    for (int k = 0; k < s_ - 1; ++k) {
      b[k] = a;
      b[c_count - k] = z;
      bool found = false;
      for (int a2 = a + 1; a2 < z && !found; ++a2) {
        for (int b2 = z - 1; b2 > a2 && !found; --b2) {
          if (!feasible_[k + 1][a2 * width_ + b2]) continue;
          // Same arithmetic as the feasibility passes.
          const double head = p_.Memory(a, a2);
          if (!Fits(k, head) || p_.Memory(b2, z) > p_.cap[k] - head) continue;
          if (Inner(k, a2, b2) + Outer(k, a, z) > t) continue;
          a = a2;
          z = b2;
          found = true;
        }
      }
    }
    // Rank S-1 holds [a, z) as chunks S-1 and S; split it as evenly as the layers allow.
    b[s_ - 1] = a;
    b[s_ + 1] = z;
    int split = a + 1;
    double gap = kInf;
    for (int m = a + 1; m < z; ++m) {
      const double g = std::abs(p_.Cost(a, m) - p_.Cost(m, z));
      if (g < gap) {
        gap = g;
        split = m;
      }
    }
    b[s_] = split;
    return b;
  }

  // The bottleneck of `b` with the search's own arithmetic.
  double Bottleneck(const std::vector<int>& b) const {
    double worst = 0;
    const int c_count = 2 * s_;
    for (int k = 0; k < s_; ++k) {
      const double t =
          k == s_ - 1 ? Outer(k, b[k], b[c_count - k])
                      : Inner(k, b[k + 1], b[c_count - k - 1]) + Outer(k, b[k], b[c_count - k]);
      worst = std::max(worst, t);
    }
    return worst;
  }

 private:
  // Feasible(a, b) iff min over a' > a, b' < b with feasible_[k+1](a', b') of Inner(k, a', b')
  // is <= t - Outer(k, a, b): a 2-D dominance minimum.
  void FillWithoutCaps(int k, double t) {
    const std::vector<uint8_t>& next = feasible_[k + 1];
    // row[a2 * width + b]: min over b2 <= b-1 of Inner(k, a2, b2) for feasible (a2, b2).
    std::vector<double> row(width_ * width_, kInf);
    for (int a2 = 0; a2 <= l_; ++a2) {
      double running = kInf;
      for (int b = 1; b <= l_; ++b) {
        const int b2 = b - 1;
        if (next[a2 * width_ + b2]) running = std::min(running, Inner(k, a2, b2));
        row[a2 * width_ + b] = running;
      }
    }
    // corner(a, b) = min over a2 >= a+1 of row(a2, b), built from a = L down.
    std::vector<double> corner(width_, kInf);
    std::vector<uint8_t>& f = feasible_[k];
    const int need = 2 * (s_ - k);
    for (int a = l_ - 1; a >= 0; --a) {
      for (int b = 0; b <= l_; ++b) corner[b] = std::min(corner[b], row[(a + 1) * width_ + b]);
      if (a < k || a > l_ - k) continue;
      for (int b = a + need; b <= l_ - k; ++b) {
        f[a * width_ + b] = corner[b] != kInf && corner[b] + Outer(k, a, b) <= t;
      }
    }
  }

  // With caps: for each (a, a'), slide over b keeping the window of b' allowed by memory
  // (b' >= lowest(b), which rises with b) and b' <= b-1, with a monotone deque of Inner values.
  void FillWithCaps(int k, double t) {
    const std::vector<uint8_t>& next = feasible_[k + 1];
    std::vector<uint8_t>& f = feasible_[k];
    const int need = 2 * (s_ - k);
    std::deque<int> window;
    for (int a = k; a <= l_ - k; ++a) {
      for (int a2 = a + 1; a2 <= l_ - k; ++a2) {
        const double head = p_.Memory(a, a2);
        if (!Fits(k, head)) break;
        const double room = p_.cap[k] - head;
        window.clear();
        int lowest = a2 + 1;  // Smallest b' still allowed by memory.
        int added = a2 + 1;   // Next b' to enter the window.
        for (int b = a + need; b <= l_ - k; ++b) {
          while (added <= b - 1) {
            if (next[a2 * width_ + added]) {
              const double v = Inner(k, a2, added);
              while (!window.empty() && Inner(k, a2, window.back()) >= v) window.pop_back();
              window.push_back(added);
            }
            ++added;
          }
          while (lowest < b && p_.Memory(lowest, b) > room) ++lowest;
          while (!window.empty() && window.front() < lowest) window.pop_front();
          if (!window.empty() && Inner(k, a2, window.front()) + Outer(k, a, b) <= t) {
            f[a * width_ + b] = 1;
          }
        }
      }
    }
  }

  const Problem& p_;
  const int s_;
  const int l_;
  const size_t width_;
  std::vector<std::vector<uint8_t>> feasible_;  // [k][a * width + b]
};

uint64_t Bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

double FromBits(uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

absl::StatusOr<std::vector<int>> VShapePartition(const Problem& p) {
  if (p.has_caps &&
      static_cast<double>(p.stages()) * p.layers * p.layers * p.layers > kMaxVShapeMemoryWork) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the exact V-shape search with memory caps is O(S*L^3) per probe; S=", p.stages(),
        " and L=", p.layers, " exceed its limit (S*L^3 <= ", kMaxVShapeMemoryWork, ")"));
  }
  if (static_cast<double>(p.stages()) * p.layers * p.layers > kMaxVShapeWork) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the exact V-shape search is O(S*L^2) per probe; S=", p.stages(),
                     " and L=", p.layers, " exceed its limit (S*L^2 <= ", kMaxVShapeWork, ")"));
  }
  VShapeSearch search(p);
  if (!search.Feasible(kInf)) return MemoryInfeasible(p, "");
  std::vector<int> best = search.Reconstruct(kInf);
  uint64_t hi = Bits(search.Bottleneck(best));
  if (search.Feasible(0.0)) return search.Reconstruct(0.0);
  uint64_t lo = Bits(0.0);  // Infeasible.
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    const double t = FromBits(mid);
    if (search.Feasible(t)) {
      best = search.Reconstruct(t);
      hi = std::min(mid, Bits(search.Bottleneck(best)));
    } else {
      lo = mid;
    }
  }
  return best;
}

// Worker-level objective of a looped cut: memory over the caps, then bottleneck, then the sum of
// squared worker times.
struct Score {
  double excess = 0;
  double bottleneck = 0;
  double squares = 0;
};

bool Better(const Score& x, const Score& y) {
  auto less = [](double u, double v) { return u < v - 1e-12 * (1 + std::abs(v)); };
  if (less(x.excess, y.excess)) return true;
  if (less(y.excess, x.excess)) return false;
  if (less(x.bottleneck, y.bottleneck)) return true;
  if (less(y.bottleneck, x.bottleneck)) return false;
  return less(x.squares, y.squares);
}

Score ScoreOf(const Problem& p, const std::vector<int>& b) {
  const int s = p.stages();
  std::vector<double> time(s, 0.0);
  std::vector<double> memory(s, 0.0);
  for (int c = 0; c < p.chunks(); ++c) {
    const int w = p.placement.OwnerOf(c);
    time[w] += p.Cost(b[c], b[c + 1]) / p.speed[w];
    memory[w] += p.Memory(b[c], b[c + 1]);
    if (CutIsRemote(p.placement, c)) {
      time[w] += p.bt[b[c]];
      time[p.placement.OwnerOf(c - 1)] += p.bt[b[c]];
    }
  }
  Score score;
  for (int w = 0; w < s; ++w) {
    score.excess += std::max(0.0, memory[w] - p.cap[w]);
    score.bottleneck = std::max(score.bottleneck, time[w]);
    score.squares += time[w] * time[w];
  }
  return score;
}

// Depth-first branch and bound over the cuts of a looped placement, chunk by chunk in model
// order. Prunes on memory, on the bottleneck so far and on the water level of the remaining cost
// spread perfectly over the ranks' speeds. Starts from an incumbent (kInf for none).
class LoopedSearch {
 public:
  LoopedSearch(const Problem& p, double incumbent, std::vector<int> incumbent_cut)
      : p_(p),
        c_count_(p.chunks()),
        best_(incumbent),
        best_cut_(std::move(incumbent_cut)),
        time_(p.stages(), 0.0),
        memory_(p.stages(), 0.0),
        cut_(c_count_ + 1, 0) {
    for (double s : p.speed) speed_sum_ += s;
  }

  // Searches at most `budget` nodes. True if the search finished, i.e. best() is optimal (or no
  // cut fits the caps if best() is kInf).
  bool Run(int64_t budget) {
    budget_ = budget;
    cut_[0] = 0;
    cut_[c_count_] = p_.layers;
    Visit(0, 0);
    return !aborted_;
  }
  double best() const { return best_; }
  const std::vector<int>& best_cut() const { return best_cut_; }

 private:
  // Chunks 0..c-1 are placed and chunk c starts at layer x.
  void Visit(int c, int x) {
    if (aborted_) return;
    if (++nodes_ > budget_) {
      aborted_ = true;
      return;
    }
    const int w = p_.placement.OwnerOf(c);
    const int last = c_count_ - 1;
    const int y_max = c == last ? p_.layers : p_.layers - (last - c);
    const int y_min = c == last ? p_.layers : x + 1;
    for (int y = y_min; y <= y_max; ++y) {
      const double memory = memory_[w] + p_.Memory(x, y);
      if (memory > p_.cap[w]) break;  // Grows with y.
      const double compute = time_[w] + p_.Cost(x, y) / p_.speed[w];
      if (compute >= best_) break;  // Grows with y.
      const bool remote = CutIsRemote(p_.placement, c + 1);
      const int next = c == last ? w : p_.placement.OwnerOf(c + 1);
      const double transfer = remote ? p_.bt[y] : 0.0;
      const double mine = compute + transfer;
      if (mine >= best_ || time_[next] + transfer >= best_) continue;
      // Apply.
      const double old_mine = time_[w];
      const double old_memory = memory_[w];
      weighted_ += (mine - old_mine) * p_.speed[w];
      time_[w] = mine;
      memory_[w] = memory;
      if (remote) {
        time_[next] += transfer;
        weighted_ += transfer * p_.speed[next];
      }
      cut_[c + 1] = y;
      if (c == last) {
        double worst = 0;
        for (double t : time_) worst = std::max(worst, t);
        if (worst < best_) {
          best_ = worst;
          best_cut_ = cut_;
        }
      } else {
        const double level = (weighted_ + p_.Cost(y, p_.layers)) / speed_sum_;
        double worst = 0;
        for (double t : time_) worst = std::max(worst, t);
        if (std::max(worst, level) < best_) Visit(c + 1, y);
      }
      // Undo.
      if (remote) {
        time_[next] -= transfer;
        weighted_ -= transfer * p_.speed[next];
      }
      weighted_ -= (mine - old_mine) * p_.speed[w];
      time_[w] = old_mine;
      memory_[w] = old_memory;
      if (aborted_) return;
    }
  }

  const Problem& p_;
  const int c_count_;
  double best_;
  std::vector<int> best_cut_;
  std::vector<double> time_;    // [rank] time of the chunks placed so far (+ their transfers).
  std::vector<double> memory_;  // [rank]
  std::vector<int> cut_;
  double weighted_ = 0;  // sum over ranks of time * speed.
  double speed_sum_ = 0;
  int64_t nodes_ = 0;
  int64_t budget_ = 0;
  bool aborted_ = false;
};

// Nodes the looped branch and bound may visit (tens of milliseconds).
constexpr int64_t kLoopedSearchBudget = 1 << 21;

// Looped placement, V >= 2: chunk-level exact start, single-layer boundary moves while the
// worker-level score improves, then branch and bound from that incumbent. Sets `*proven` if the
// branch and bound finished.
absl::StatusOr<std::vector<int>> LoopedPartition(const Problem& p, bool* proven) {
  const int c_count = p.chunks();
  const int v = p.placement.virtual_stages;
  std::vector<double> chunk_cap(c_count);
  for (int c = 0; c < c_count; ++c) chunk_cap[c] = p.cap[p.placement.OwnerOf(c)] / v;
  std::vector<int> b = ChainPartition(p, chunk_cap);
  if (b.empty()) b = ChainPartition(p, std::vector<double>(c_count, kInf));
  if (b.empty()) {
    return absl::InternalError(absl::StrCat("the partitioner found no chunk-level cut of ",
                                            p.layers, " layers into ", c_count, " chunks (a bug)"));
  }
  Score score = ScoreOf(p, b);
  const int64_t max_moves = 100LL * p.layers * c_count;
  int64_t moves = 0;
  for (bool improved = true; improved && moves < max_moves;) {
    improved = false;
    for (int c = 1; c < c_count; ++c) {
      for (int d : {-1, 1}) {
        const int x = b[c] + d;
        if (x <= b[c - 1] || x >= b[c + 1]) continue;
        const int old = b[c];
        b[c] = x;
        const Score candidate = ScoreOf(p, b);
        if (Better(candidate, score)) {
          score = candidate;
          improved = true;
          ++moves;
        } else {
          b[c] = old;
        }
      }
    }
  }
  LoopedSearch search(p, score.excess > 0 ? kInf : score.bottleneck, b);
  *proven = search.Run(kLoopedSearchBudget);
  if (search.best() == kInf) {
    return MemoryInfeasible(p, *proven ? ""
                                       : " (found by a search that ran out of its node budget, "
                                         "so a fitting cut may still exist)");
  }
  return search.best_cut();
}

// Sum over chunks of the squared chunk time (cost at its owner's speed).
double ChunkSquares(const Problem& p, const std::vector<int>& b) {
  double squares = 0;
  for (int c = 0; c < p.chunks(); ++c) {
    const double t = p.Cost(b[c], b[c + 1]) / p.speed[p.placement.OwnerOf(c)];
    squares += t * t;
  }
  return squares;
}

// Chunks per worker > 1: many cuts share the best worker-level score (a worker's chunks can trade
// layers), and the searches return any of them, often one with a near-empty chunk beside a huge
// one. The schedules assume even chunks (a micro-batch crosses every chunk in turn), so among cuts
// no worse at the worker level (memory over the caps, bottleneck) this moves boundaries while the
// sum of squared chunk times falls: two boundaries by up to two layers each, or a run of
// consecutive boundaries by the same one or two layers (a worker's chunk then trades layers with
// its other chunk across the chunks between them).
void BalanceChunks(const Problem& p, std::vector<int>* cut) {
  std::vector<int>& b = *cut;
  const int c_count = p.chunks();
  const Score limit = ScoreOf(p, b);
  const auto at_most = [](double u, double v) { return u <= v + 1e-12 * (1 + std::abs(v)); };
  double squares = ChunkSquares(p, b);
  // Keeps the boundaries as they are now if they are a valid cut no worse than `limit` with more
  // even chunks; else restores `saved`.
  auto try_keep = [&](const std::vector<int>& saved) {
    bool ok = true;
    for (int c = 0; ok && c < c_count; ++c) ok = b[c] < b[c + 1];
    if (ok) {
      const Score s = ScoreOf(p, b);
      const double candidate = ChunkSquares(p, b);
      // Memory is exact (whole bytes below 2^53): a move may never add excess over a cap.
      if (s.excess <= limit.excess && at_most(s.bottleneck, limit.bottleneck) &&
          candidate < squares - 1e-12 * (1 + squares)) {
        squares = candidate;
        return true;
      }
    }
    b = saved;
    return false;
  };
  // Candidates tried, each O(chunks): bounds the time for many chunks (well under a second).
  constexpr int64_t kMaxCandidates = int64_t{1} << 20;
  int64_t candidates = 0;
  for (bool improved = true; improved && candidates < kMaxCandidates;) {
    improved = false;
    for (int i = 1; i < c_count && candidates < kMaxCandidates; ++i) {
      for (int j = i; j < c_count; ++j) {
        for (int di = -2; di <= 2; ++di) {
          for (int dj = -2; dj <= 2; ++dj) {
            if ((i == j && dj != 0) || (di == 0 && dj == 0)) continue;
            const std::vector<int> saved = b;
            b[i] += di;
            if (j != i) b[j] += dj;
            ++candidates;
            improved = try_keep(saved) || improved;
          }
        }
        if (j - i < 2) continue;  // runs of one or two boundaries are pairs above.
        for (int d : {-2, -1, 1, 2}) {
          const std::vector<int> saved = b;
          for (int c = i; c <= j; ++c) b[c] += d;
          ++candidates;
          improved = try_keep(saved) || improved;
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<Partition> EvaluatePartition(const std::vector<double>& layer_costs,
                                            const PartitionOptions& options,
                                            const std::vector<int>& boundaries) {
  PT_ASSIGN_OR_RETURN(Problem p, MakeProblem(layer_costs, options));
  const int c_count = p.chunks();
  if (static_cast<int>(boundaries.size()) != c_count + 1) {
    return absl::InvalidArgumentError(absl::StrCat("got ", boundaries.size(), " boundaries for ",
                                                   c_count, " chunks (need chunks + 1)"));
  }
  if (boundaries.front() != 0 || boundaries.back() != p.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundaries must start at 0 and end at ", p.layers));
  }
  for (int c = 0; c < c_count; ++c) {
    if (boundaries[c + 1] <= boundaries[c]) {
      return absl::InvalidArgumentError(absl::StrCat("boundaries must strictly increase (chunk ", c,
                                                     " is [", boundaries[c], ", ",
                                                     boundaries[c + 1], "))"));
    }
  }
  return Evaluate(layer_costs, p, boundaries, options.layer_memory);
}

absl::StatusOr<Partition> PartitionLayers(const std::vector<double>& layer_costs,
                                          const PartitionOptions& options) {
  PT_ASSIGN_OR_RETURN(Problem p, MakeProblem(layer_costs, options));
  std::vector<int> b;
  bool exact = true;
  if (p.placement.kind == PlacementKind::kVShape) {
    PT_ASSIGN_OR_RETURN(b, VShapePartition(p));
  } else if (p.placement.virtual_stages == 1) {
    b = ChainPartition(p, p.cap);
    if (b.empty()) return MemoryInfeasible(p, "");
  } else {
    PT_ASSIGN_OR_RETURN(b, LoopedPartition(p, &exact));
  }
  if (p.placement.virtual_stages > 1) BalanceChunks(p, &b);
  bool valid =
      static_cast<int>(b.size()) == p.chunks() + 1 && b.front() == 0 && b.back() == p.layers;
  for (size_t c = 0; valid && c + 1 < b.size(); ++c) valid = b[c] < b[c + 1];
  if (!valid) return absl::InternalError("partitioner produced invalid boundaries (a bug)");
  Partition out = Evaluate(layer_costs, p, b, options.layer_memory);
  out.proven_optimal = exact;
  return out;
}

}  // namespace pipetrain::partition
