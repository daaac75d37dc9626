#include "client/cli/shape_line.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

std::string ShapeWords(int stages, int replicas) {
  const std::string s = absl::StrCat(stages, stages == 1 ? " stage" : " stages");
  return replicas > 1 ? absl::StrCat(replicas, " replicas x ", s) : s;
}

}  // namespace

std::string ShapeOfSpec(const v1::JobSpec& spec) {
  return ShapeWords(std::max(1, spec.stages()), std::max(1, spec.replicas()));
}

std::string ShapeChangeLine(const v1::ShapeChange& c, bool json) {
  const int replicas_before = std::max(1, c.replicas_before());
  const int replicas = std::max(1, c.replicas());
  if (json) {
    nlohmann::ordered_json j = {
        {"step", c.step()},
        {"stages_before", c.stages_before()},
        {"stages", c.stages()},
        {"replicas_before", replicas_before},
        {"replicas", replicas},
        {"joined", std::vector<std::string>(c.joined().begin(), c.joined().end())},
        {"workers", std::vector<std::string>(c.workers().begin(), c.workers().end())},
        {"generation", c.generation()},
        {"seconds", c.seconds()},
        {"checkpoint", c.checkpoint()},
        {"failed", c.failed()},
    };
    return nlohmann::ordered_json{{"shape_change", j}}.dump() + "\n";
  }
  if (!c.failed().empty()) {
    return absl::StrFormat("step %d: did not grow (%s); stays at %s\n", c.step(), c.failed(),
                           ShapeWords(c.stages(), replicas));
  }
  const bool same_replicas = replicas == replicas_before;
  const std::string from_to =
      same_replicas && replicas == 1
          ? absl::StrFormat("from %d to %d stages", c.stages_before(), c.stages())
          : absl::StrCat("from ", ShapeWords(c.stages_before(), replicas_before), " to ",
                         ShapeWords(c.stages(), replicas));
  return absl::StrFormat("step %d: grew %s (%s %s joined) in %.2f s; generation %d on %s\n",
                         c.step(), from_to, c.joined_size() == 1 ? "worker" : "workers",
                         absl::StrJoin(c.joined(), ", "), c.seconds(), c.generation(),
                         absl::StrJoin(c.workers(), ", "));
}

}  // namespace pipetrain::cli
