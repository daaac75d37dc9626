#include "common/schedule/link_latency.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

namespace pipetrain::schedule {
namespace {

// (a + b) / 2 for finite a and b without overflowing when the sum would.
double Midpoint(double a, double b) {
  const double sum = a + b;
  return std::isfinite(sum) ? sum / 2 : a / 2 + b / 2;
}

// The median of `v` (not empty); the mean of the two middle values for an even count.
double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return Midpoint(lower, upper);
}

}  // namespace

std::optional<double> EstimateLinkLatency(const std::vector<LinkObservation>& observations) {
  // A tensor's identity: (from, to, kind, micro-batch, chunk).
  using Key = std::tuple<int, int, int, int32_t, int32_t>;
  std::map<Key, double> sent;      // send start, on the sender's clock.
  std::map<Key, double> received;  // receive end, on the receiver's clock.
  for (const LinkObservation& o : observations) {
    // A time that is not finite (a corrupt report) says nothing; NaN would also break the
    // ordering the medians rely on.
    if (!std::isfinite(o.start) || !std::isfinite(o.end)) continue;
    if (o.send) {
      sent.emplace(Key{o.rank, o.peer, o.kind, o.microbatch, o.chunk}, o.start);
    } else {
      received.emplace(Key{o.peer, o.rank, o.kind, o.microbatch, o.chunk}, o.end);
    }
  }
  std::map<std::pair<int, int>, std::vector<double>> delays;  // (from, to) -> apparent delays.
  for (const auto& [key, start] : sent) {
    auto it = received.find(key);
    if (it == received.end()) continue;
    const double delay = it->second - start;
    if (!std::isfinite(delay)) continue;  // the two clocks' readings are too far apart.
    delays[{std::get<0>(key), std::get<1>(key)}].push_back(delay);
  }
  std::vector<double> pairs;
  for (const auto& [direction, forward] : delays) {
    const auto [from, to] = direction;
    if (from >= to) continue;  // each pair once, from its lower rank.
    auto back = delays.find({to, from});
    if (back == delays.end()) continue;
    pairs.push_back(Midpoint(Median(forward), Median(back->second)));
  }
  if (pairs.empty()) return std::nullopt;
  return std::max(0.0, Median(pairs));
}

}  // namespace pipetrain::schedule
