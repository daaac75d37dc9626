#include "server/worker/job_plan.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/model/optimizer_proto.h"
#include "common/util/status_macros.h"
#include "server/control/control_proto.h"

namespace pipetrain::worker {
namespace {

// Checks the Assign's scalar fields and the sizes of its lists (INVALID_ARGUMENT, AssignError).
absl::Status CheckShape(const v1::Assign& a, int threads_max) {
  if (a.job().empty()) return AssignError(a, "empty job id");
  if (a.generation() < 0)
    return AssignError(a, absl::StrCat("generation ", a.generation(), " < 0"));
  if (a.stages() < 1 || a.virtual_stages() < 1 || a.microbatches() < 1) {
    return AssignError(
        a, absl::StrCat("stages (", a.stages(), "), virtual_stages (", a.virtual_stages(),
                        ") and microbatches (", a.microbatches(), ") must be >= 1"));
  }
  if (static_cast<int64_t>(a.stages()) * a.virtual_stages() > (int64_t{1} << 20)) {
    return AssignError(a, "stages * virtual_stages is too large");
  }
  if (a.rank() < 0 || a.rank() >= a.stages()) {
    return AssignError(a, absl::StrCat("rank ", a.rank(), " is outside [0, ", a.stages(), ")"));
  }
  if (a.link_secret().empty()) {
    return AssignError(a,
                       "no link_secret: without it any process could feed this job's data "
                       "streams");
  }
  if (a.threads() < 1 || a.threads() > threads_max) {
    return AssignError(a,
                       absl::StrCat("threads ", a.threads(), " is outside [1, ", threads_max, "]"));
  }
  if (a.worker_addresses_size() != a.stages()) {
    return AssignError(a, absl::StrCat(a.worker_addresses_size(), " worker addresses for ",
                                       a.stages(), " stages"));
  }
  const int num_chunks = a.stages() * a.virtual_stages();
  if (a.chunks_size() != num_chunks) {
    return AssignError(a, absl::StrCat(a.chunks_size(),
                                       " chunks, expected stages * virtual_stages = ", num_chunks));
  }
  return absl::OkStatus();
}

// Whether `address` is "host:port" with a non-empty host and a port in [1, 65535].
bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  return absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) && port >= 1 &&
         port <= 65535 && address.find_first_of(" \t\n") == std::string::npos;
}

// Checks Assign.replica, replicas and replica_addresses into *plan (INVALID_ARGUMENT,
// AssignError naming the field).
absl::Status CheckReplicas(const v1::Assign& a, JobPlan* plan) {
  const int replicas = a.replicas() == 0 ? 1 : a.replicas();
  if (replicas < 1 || (replicas & (replicas - 1)) != 0) {
    return AssignError(
        a, absl::StrCat("replicas ", a.replicas(), " is not a power of two >= 1 (0 means 1)"));
  }
  if (a.replica() < 0 || a.replica() >= replicas) {
    return AssignError(
        a, absl::StrCat("replica ", a.replica(), " is outside [0, ", replicas, ") (replicas)"));
  }
  if (replicas == 1 && a.replica_addresses_size() == 0) return absl::OkStatus();
  if (a.replica_addresses_size() != replicas) {
    return AssignError(a, absl::StrCat(a.replica_addresses_size(), " replica_addresses for ",
                                       replicas, " replicas"));
  }
  for (int q = 0; q < replicas; ++q) {
    if (!IsHostPort(a.replica_addresses(q))) {
      return AssignError(a, absl::StrCat("replica_addresses[", q, "] '", a.replica_addresses(q),
                                         "' is not host:port"));
    }
  }
  if (a.replica_addresses(a.replica()) != a.worker_addresses(a.rank())) {
    return AssignError(
        a, absl::StrCat("replica_addresses[", a.replica(), "] '", a.replica_addresses(a.replica()),
                        "' is not this worker's own address worker_addresses[", a.rank(), "] '",
                        a.worker_addresses(a.rank()), "'"));
  }
  plan->replica = a.replica();
  plan->replicas = replicas;
  plan->replica_addresses.assign(a.replica_addresses().begin(), a.replica_addresses().end());
  return absl::OkStatus();
}

// The level every rank of the job runs, if this worker runs it (FAILED_PRECONDITION otherwise).
absl::StatusOr<math::Isa> JobIsa(const v1::Assign& a, const std::optional<math::Isa>& max_isa) {
  absl::StatusOr<math::Isa> isa = RunnableIsa(a.isa(), max_isa);
  if (!isa.ok()) {
    return absl::Status(isa.status().code(),
                        absl::StrCat("Assign(job ", a.job(), ", generation ", a.generation(),
                                     "): ", isa.status().message()));
  }
  return isa;
}

// Whether the Assign's chunks are two copies of its stages (JobPlan::two_copies): V = 2 and
// chunk S (the up copy's first) starts at layer 0.
bool TwoCopies(const v1::Assign& a, int num_chunks) {
  return a.virtual_stages() == 2 && num_chunks == 2 * a.stages() &&
         a.chunks(a.stages()).first_layer() == 0;
}

// The ranks of two copies' chunks, once chunks [0, S) are checked to tile the model's `layers`
// on ranks 0..S-1, and chunk S + k to repeat chunk k's layers on rank S-1-k.
absl::StatusOr<std::vector<int>> CopyOwners(const v1::Assign& a, int num_chunks, int64_t layers) {
  const int s = a.stages();
  std::vector<int> owner(num_chunks);
  for (int c = 0; c < num_chunks; ++c) {
    const v1::ChunkSpec& spec = a.chunks(c);
    const bool down = c < s;
    const int stage = down ? c : c - s;
    const int rank = down ? c : s - 1 - stage;
    const int64_t first = stage == 0 ? 0 : a.chunks(stage - 1).last_layer();
    const int64_t last = stage == s - 1 ? layers : a.chunks(stage).last_layer();
    if (spec.chunk() != c) {
      return AssignError(a, absl::StrCat("chunks[", c, "] has chunk index ", spec.chunk()));
    }
    if (spec.rank() != rank) {
      return AssignError(
          a, absl::StrCat("chunk ", c, " is on rank ", spec.rank(),
                          "; two copies of the stages "
                          "(dualpipe) put chunk c < S on rank c and chunk S+k on rank S-1-k (",
                          rank, ")"));
    }
    if (spec.first_layer() != first || spec.last_layer() != last || last <= first ||
        last > layers) {
      return AssignError(
          a, absl::StrCat("chunk ", c, " has layers [", spec.first_layer(), ", ", spec.last_layer(),
                          "); two copies of the stages (dualpipe) need chunks 0..S-1 to tile [0, ",
                          layers, ") in order, each non-empty, and chunk S+k to repeat chunk k's"));
    }
    if (a.worker_addresses(rank).empty()) {
      return AssignError(a, absl::StrCat("rank ", rank, " has no address"));
    }
    owner[c] = rank;
  }
  return owner;
}

// The rank of every chunk, once the chunks are checked to tile the model's `layers` in order,
// each on a worker with an address.
absl::StatusOr<std::vector<int>> ChunkOwners(const v1::Assign& a, int num_chunks, int64_t layers) {
  if (TwoCopies(a, num_chunks)) return CopyOwners(a, num_chunks, layers);
  std::vector<int> owner(num_chunks);
  for (int c = 0; c < num_chunks; ++c) {
    const v1::ChunkSpec& spec = a.chunks(c);
    const int64_t expected_first = c == 0 ? 0 : a.chunks(c - 1).last_layer();
    if (spec.chunk() != c) {
      return AssignError(a, absl::StrCat("chunks[", c, "] has chunk index ", spec.chunk()));
    }
    if (spec.rank() < 0 || spec.rank() >= a.stages()) {
      return AssignError(a, absl::StrCat("chunk ", c, " is on rank ", spec.rank(), " outside [0, ",
                                         a.stages(), ")"));
    }
    if (spec.first_layer() != expected_first || spec.last_layer() <= spec.first_layer() ||
        spec.last_layer() > layers || (c == num_chunks - 1 && spec.last_layer() != layers)) {
      return AssignError(
          a, absl::StrCat("chunk ", c, " has layers [", spec.first_layer(), ", ", spec.last_layer(),
                          "); chunks must tile [0, ", layers, ") in order, each non-empty"));
    }
    if (a.worker_addresses(spec.rank()).empty()) {
      return AssignError(a, absl::StrCat("rank ", spec.rank(), " has no address"));
    }
    owner[c] = spec.rank();
  }
  return owner;
}

// This rank's actions, once each is checked to be on a chunk it holds and a micro-batch of the
// job; never empty.
absl::StatusOr<std::vector<schedule::Action>> RankActions(const v1::Assign& a,
                                                          const std::vector<int>& owner) {
  absl::StatusOr<std::vector<schedule::Action>> actions = control::ActionsFromProto(a.actions());
  if (!actions.ok()) return AssignError(a, actions.status().message());
  if (actions->empty()) return AssignError(a, "no actions");
  const int num_chunks = static_cast<int>(owner.size());
  for (size_t i = 0; i < actions->size(); ++i) {
    const schedule::Action& act = (*actions)[i];
    if (act.chunk >= num_chunks || owner[act.chunk] != a.rank()) {
      return AssignError(
          a, absl::StrCat("action ", i, " ", schedule::ActionToString(act),
                          " is on a chunk this worker (rank ", a.rank(), ") does not hold"));
    }
    if (act.mb >= a.microbatches()) {
      return AssignError(a, absl::StrCat("action ", i, " ", schedule::ActionToString(act),
                                         " has a micro-batch outside [0, ", a.microbatches(), ")"));
    }
  }
  return actions;
}

}  // namespace

absl::StatusOr<math::Isa> RunnableIsa(absl::string_view name,
                                      const std::optional<math::Isa>& max_isa) {
  // Empty: a coordinator older than Assign.isa, which ran every worker at the lowest built level.
  math::Isa isa = math::BuiltIsas().front();
  if (!name.empty()) {
    absl::StatusOr<math::Isa> parsed = math::ParseIsa(name);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("isa: ", parsed.status().message()));
    }
    isa = *parsed;
  }
  const std::vector<math::Isa> runnable = math::SupportedIsas(max_isa);
  if (std::find(runnable.begin(), runnable.end(), isa) == runnable.end()) {
    return absl::FailedPreconditionError(absl::StrCat("this worker cannot run instruction set ",
                                                      math::IsaName(isa), " (it runs ",
                                                      math::IsaListName(runnable), ")"));
  }
  return isa;
}

absl::Status AssignError(const v1::Assign& assign, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("Assign(job ", assign.job(), ", generation ", assign.generation(), "): ", what));
}

absl::StatusOr<JobPlan> PlanJob(const v1::Assign& a, int threads_max,
                                const std::optional<math::Isa>& max_isa) {
  PT_RETURN_IF_ERROR(CheckShape(a, threads_max));
  JobPlan plan;
  PT_RETURN_IF_ERROR(CheckReplicas(a, &plan));
  PT_ASSIGN_OR_RETURN(const math::Isa isa, JobIsa(a, max_isa));
  plan.num_chunks = a.stages() * a.virtual_stages();
  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Build(a.model(), model::ModelLimits(), isa);
  if (!model.ok()) return AssignError(a, absl::StrCat("model: ", model.status().message()));
  plan.model = *std::move(model);
  PT_ASSIGN_OR_RETURN(plan.owner, ChunkOwners(a, plan.num_chunks, plan.model->num_layers()));
  plan.two_copies = TwoCopies(a, plan.num_chunks);
  PT_ASSIGN_OR_RETURN(plan.actions, RankActions(a, plan.owner));
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(a.optimizer());
  if (!optimizer.ok()) {
    return AssignError(a, absl::StrCat("optimizer: ", optimizer.status().message()));
  }
  plan.optimizer = *optimizer;
  return plan;
}

}  // namespace pipetrain::worker
