#include "server/coordinator/job_isa.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job/job_spec.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

std::vector<math::Isa> WorkerIsas(const v1::RegisterWorker& worker) {
  if (worker.isa_levels().empty()) return {math::BuiltIsas().front()};
  std::vector<math::Isa> out;
  for (const std::string& name : worker.isa_levels()) {
    if (std::optional<math::Isa> isa = math::IsaFromName(name); isa.has_value()) {
      out.push_back(*isa);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool WorkerRunsIsa(const v1::RegisterWorker& worker, math::Isa isa) {
  const std::vector<math::Isa> levels = WorkerIsas(worker);
  return std::find(levels.begin(), levels.end(), isa) != levels.end();
}

absl::StatusOr<math::Isa> ChooseJobIsa(const v1::JobSpec& spec,
                                       const std::vector<const v1::RegisterWorker*>& workers) {
  if (absl::Status s = job::CheckJobIsa(spec); !s.ok()) return s;
  if (!spec.isa().empty()) {
    const math::Isa wanted = *math::IsaFromName(spec.isa());
    for (const v1::RegisterWorker* w : workers) {
      if (!WorkerRunsIsa(*w, wanted)) {
        return absl::FailedPreconditionError(absl::StrCat("isa ", spec.isa(), ": worker '",
                                                          w->name(), "' cannot run it (it runs ",
                                                          math::IsaListName(WorkerIsas(*w)), ")"));
      }
    }
    return wanted;
  }
  std::vector<std::vector<math::Isa>> levels;
  for (const v1::RegisterWorker* w : workers) levels.push_back(WorkerIsas(*w));
  return math::PickCommonIsa(levels);
}

}  // namespace pipetrain::coordinator
