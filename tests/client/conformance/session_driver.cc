// Plays a conformance scenario's actions with the C++ SDK (client::Client, TrainSession) against
// the coordinator at ADDRESS and prints what the client observed, one line per action (and
// indented lines for the waits, pauses and recoveries of a recovery), exactly as
// session_driver.py prints them for the Python client. Usage: session_driver SCENARIO.json ADDRESS
//
// The actions map onto the SDK as a C++ program uses it: "create" checks the replay options
// (TrainOptions::Check, as the Python client's create_job does before the job is made), calls
// CreateJob (with save_to and keep_checkpoints if given) and StartTraining with replay on when the
// job recovers; "finish" is TrainSession::Finish (its status not printed: the Python Job's
// finish() reports none) and FinishJob; "leave" is how a program leaves the job's scope on an
// error: the TrainSession destroyed (its stream cancelled), then the job's ScopedJob; "retry" is
// Client::Checkpoint of the job (the session may be gone). Exit code 0 once every action ran (their
// errors are printed), 2 for a bad scenario.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "common/math/tensor.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

using nlohmann::json;

void Out(const std::string& line) {
  std::cout << line << std::endl;  // flushed: the runner reads it as it comes
}

std::string Error(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), " | ", status.message());
}

std::string StepLine(const v1::StepResult& r) {
  return absl::StrFormat("step %d loss %.9g", r.step(), r.loss());
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%gs", absl::ToDoubleSeconds(d)); }

std::string Defaults() {
  const TrainOptions train;
  const ClientOptions client;
  return absl::StrCat("max_kept_batches ", train.max_kept_batches, ", recovery_timeout ",
                      Seconds(train.recovery_timeout), ", reconnect_timeout ",
                      Seconds(train.reconnect_timeout), ", max_poll_interval ",
                      Seconds(train.max_poll_interval), ", rounds ", TrainSession::kRecoveryRounds,
                      "; connect_timeout ", Seconds(client.connect_timeout), ", call_timeout ",
                      Seconds(client.call_timeout), ", long_call_timeout ",
                      Seconds(client.long_call_timeout), ", keepalive ",
                      Seconds(client.keepalive_interval), "/", Seconds(client.keepalive_timeout));
}

// The batch tagged `tag`: `tag` samples of one zero feature and one zero target.
struct Batch {
  explicit Batch(int64_t tag) : inputs(math::Matrix::Zero(tag, 1)), targets(inputs), samples(tag) {}
  BatchView view() const { return BatchView{&inputs, &targets, samples}; }
  math::Matrix inputs, targets;
  int64_t samples;
};

absl::Duration SecondsOf(const json& value) {
  return absl::Milliseconds(static_cast<int64_t>(value.get<double>() * 1000 + 0.5));
}

// Runs the scenario; INVALID_ARGUMENT for an action it does not know.
absl::Status Play(const json& scenario, const std::string& address) {
  std::unique_ptr<Client> client;
  std::unique_ptr<TrainSession> session;
  std::string job;
  for (const json& action : scenario.at("actions")) {
    const std::string name = action.begin().key();
    const json& arg = action.begin().value();
    const std::string label =
        arg.is_number_integer() ? absl::StrCat(name, " ", arg.get<int64_t>()) : name;
    absl::Status error;
    // Actions that need only the job, not its session (which "leave" ends).
    const bool of_the_job = name == "finish" || name == "retry" || name == "failed_checkpoint";
    if ((name != "defaults" && name != "connect" && client == nullptr) ||
        (name != "defaults" && name != "connect" && name != "create" &&
         (of_the_job ? job.empty() : session == nullptr))) {
      Out(label + " -> FAILED_PRECONDITION | the scenario has no " +
          (client == nullptr ? "connection" : "job"));
      continue;
    }
    if (name == "defaults") {
      Out("defaults -> " + Defaults());
    } else if (name == "connect") {
      ClientOptions options;
      options.connect_timeout = absl::Seconds(10);
      if (arg.contains("keepalive_s")) {
        options.keepalive_interval = options.keepalive_timeout = SecondsOf(arg["keepalive_s"]);
      }
      absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(address, options);
      if (connected.ok()) {
        client = *std::move(connected);
        Out("connect -> ok");
      } else {
        error = connected.status();
      }
    } else if (name == "create") {
      TrainOptions options;
      const json opts = arg.value("options", json::object());
      for (const auto& [key, value] : opts.items()) {
        if (key == "max_kept_batches") {
          options.max_kept_batches = value.get<int64_t>();
        } else if (key == "recovery_timeout_s") {
          options.recovery_timeout = SecondsOf(value);
        } else if (key == "reconnect_timeout_s") {
          options.reconnect_timeout = SecondsOf(value);
        } else if (key == "max_poll_interval_s") {
          options.max_poll_interval = SecondsOf(value);
        } else {
          return absl::InvalidArgumentError(absl::StrCat("unknown option ", key));
        }
      }
      options.on_wait = [](const absl::Status& why) {
        Out(absl::StrCat("  wait ", absl::StatusCodeToString(why.code())));
      };
      options.on_recovery = [](const v1::RecoveryEvent& r) {
        Out(absl::StrFormat("  recovered from step %d (%s)", r.restored_step(), r.cause()));
      };
      options.on_shape_change = [](const v1::ShapeChange& c) {
        Out(absl::StrFormat("  grew from %d to %d stages after step %d", c.stages_before(),
                            c.stages(), c.step()));
      };
      options.pause = [](absl::Duration d) {
        Out(absl::StrCat("  pause ", absl::ToInt64Milliseconds(d), "ms"));
        std::this_thread::sleep_for(absl::ToChronoNanoseconds(d));
      };
      error = options.Check();
      if (error.ok()) {
        v1::JobSpec spec;
        spec.set_recover(arg.value("recover", true));
        spec.set_save_to(arg.value("save_to", ""));
        spec.set_keep_checkpoints(arg.value("keep", 0));
        absl::StatusOr<v1::JobStatus> created = client->CreateJob(spec);
        if (created.ok()) {
          job = created->job();
          options.replay = created->spec().recover();
          options.first_step = created->steps_done();
          absl::StatusOr<std::unique_ptr<TrainSession>> started =
              client->StartTraining(job, std::move(options));
          if (started.ok()) session = *std::move(started);
          error = started.status();
        } else {
          error = created.status();
        }
      }
      if (error.ok()) Out("create -> ok");
    } else if (name == "step") {
      absl::StatusOr<v1::StepResult> r = session->Step(Batch(arg.get<int64_t>()).view());
      if (r.ok()) Out(absl::StrCat(label, " -> ", StepLine(*r)));
      error = r.status();
    } else if (name == "send") {
      error = session->Send(Batch(arg.get<int64_t>()).view());
      if (error.ok()) Out(label + " -> ok");
    } else if (name == "receive") {
      absl::StatusOr<v1::StepResult> r = session->Receive();
      if (r.ok()) Out("receive -> " + StepLine(*r));
      error = r.status();
    } else if (name == "checkpoint") {
      std::optional<v1::DataPosition> position;
      if (arg.contains("position")) {
        const json& p = arg["position"];
        position.emplace();
        position->set_data(p.value("data", ""));
        position->set_batch_size(p.value("batch_size", int64_t{0}));
        position->set_cursor_epoch(p.value("cursor_epoch", int64_t{0}));
        position->set_cursor_batch(p.value("cursor_batch", int64_t{0}));
      }
      absl::StatusOr<v1::CheckpointResponse> saved =
          session->Checkpoint("/ckpt", arg.value("keep", 1), position);
      if (saved.ok()) Out(absl::StrCat("checkpoint -> step ", saved->step()));
      error = saved.status();
    } else if (name == "failed_checkpoint") {
      Out("failed_checkpoint -> " + client->failed_checkpoint(job).value_or("none"));
    } else if (name == "leave") {
      session.reset();
      { ScopedJob scoped(client.get(), job); }
      Out("leave -> ok");
    } else if (name == "retry") {
      absl::StatusOr<v1::CheckpointResponse> saved =
          client->Checkpoint(job, "/ckpt", arg.value("keep", 1));
      if (saved.ok()) Out(absl::StrCat("retry -> step ", saved->step()));
      error = saved.status();
    } else if (name == "kept") {
      Out(absl::StrCat("kept -> ", session->kept_batches()));
    } else if (name == "in_flight") {
      Out(absl::StrCat("in_flight -> ", session->in_flight()));
    } else if (name == "finish") {
      if (session != nullptr) session->Finish().IgnoreError();
      absl::StatusOr<v1::JobStatus> finished = client->FinishJob(job);
      if (finished.ok()) {
        std::string state = v1::JobState_Name(finished->state());
        Out("finish -> " + state.substr(std::string("JOB_STATE_").size()));
      }
      error = finished.status();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown action ", name));
    }
    if (!error.ok()) Out(absl::StrCat(label, " -> ", Error(error)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipetrain::client

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SCENARIO.json ADDRESS\n", argv[0]);
    return 2;
  }
  std::ifstream file(argv[1]);
  nlohmann::json scenario = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (scenario.is_discarded()) {
    std::fprintf(stderr, "%s: not JSON\n", argv[1]);
    return 2;
  }
  const absl::Status played = pipetrain::client::Play(scenario, argv[2]);
  if (!played.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[1], played.ToString().c_str());
    return 2;
  }
  return 0;
}
