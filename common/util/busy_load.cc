#include "common/util/busy_load.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/util/cpu_set.h"

namespace pipetrain::util {
namespace {

constexpr size_t kUnitFloats = size_t{1} << 18;  // 1 MiB.

// One unit: a pass over `buf` (the values stay in [1, 2], never denormal or infinite).
void RunUnit(std::vector<float>& buf) {
  float* p = buf.data();
  for (size_t i = 0; i < buf.size(); ++i) p[i] = p[i] * 0.5f + 1.0f;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BusyLoad>> BusyLoad::Start(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("a busy load needs at least one CPU");
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a busy load names a CPU twice: ", FormatCpuList(cpus)));
  }
  std::unique_ptr<BusyLoad> load(new BusyLoad());
  absl::Mutex mu;
  int started = 0;
  absl::Status failed;
  for (int cpu : cpus) {
    auto worker = std::make_unique<Worker>();
    Worker* w = worker.get();
    BusyLoad* self = load.get();
    w->thread = std::thread([cpu, w, self, &mu, &started, &failed] {
      std::vector<float> buf(kUnitFloats, 1.0f);
      absl::Status confined = ConfineToCpus({cpu});
      {
        absl::MutexLock lock(&mu);
        if (!confined.ok() && failed.ok()) failed = confined;
        ++started;
      }
      if (!confined.ok()) return;
      while (!self->stop_.load(std::memory_order_relaxed)) {
        RunUnit(buf);
        w->units.fetch_add(1, std::memory_order_relaxed);
      }
    });
    load->workers_.push_back(std::move(worker));
  }
  struct AllStarted {
    const int* started;
    int n;
    bool Done() const { return *started == n; }
  } all{&started, static_cast<int>(cpus.size())};
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&all, &AllStarted::Done));
  }
  load->start_ = absl::Now();
  for (auto& w : load->workers_) load->units_at_start_ += w->units.load(std::memory_order_relaxed);
  if (!failed.ok()) {
    load->Stop();
    return failed;
  }
  return load;
}

double BusyLoad::Stop() {
  if (rate_ >= 0) return rate_;
  stop_.store(true, std::memory_order_relaxed);
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start_));
  int64_t units = -units_at_start_;
  for (auto& w : workers_) units += w->units.load(std::memory_order_relaxed);
  rate_ = std::max(1e-9, static_cast<double>(units) / seconds);
  return rate_;
}

BusyLoad::~BusyLoad() { Stop(); }

}  // namespace pipetrain::util
