// A fake coordinator for stage worker tests on loopback: the generated WorkerControl callback
// service (Join and PutState) that records each worker's events by the name it registered with,
// sends it commands, and keeps the bytes of the files workers upload. Synchronisation waits on
// conditions with a timeout (kFakeCoordinatorTimeout), which only bounds a failing test.
#ifndef PIPETRAIN_TESTS_SERVER_WORKER_FAKE_COORDINATOR_H_
#define PIPETRAIN_TESTS_SERVER_WORKER_FAKE_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker::testing {

// How long a wait for a worker's registration or event lasts before the test fails.
inline constexpr absl::Duration kFakeCoordinatorTimeout = absl::Seconds(60);

// Implements WorkerControl.Join, recording each worker's events by the name it registered with and
// sending commands to it, and WorkerControl.PutState, keeping the uploaded files' bytes by name.
// Thread-safe.
class FakeCoordinator final : public v1::WorkerControl::CallbackService {
 public:
  grpc::ServerReadReactor<v1::PutStateRequest>* PutState(grpc::CallbackServerContext* context,
                                                         v1::PutStateResponse* response) override {
    // Appends every chunk to its file's bytes; one read in flight.
    class Upload final : public grpc::ServerReadReactor<v1::PutStateRequest> {
     public:
      explicit Upload(FakeCoordinator* owner) : owner_(owner) { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        {
          absl::MutexLock lock(&owner_->mu_);
          owner_->uploaded_[request_.chunk().file()].append(request_.chunk().data());
        }
        StartRead(&request_);
      }
      void OnDone() override { delete this; }

     private:
      FakeCoordinator* const owner_;
      v1::PutStateRequest request_;
    };
    return new Upload(this);
  }

  // The bytes uploaded under `file` so far ("" if none).
  std::string Uploaded(const std::string& file) {
    absl::MutexLock lock(&mu_);
    auto it = uploaded_.find(file);
    return it == uploaded_.end() ? std::string() : it->second;
  }

  // Forgets every uploaded file (for a test that has several workers upload the same names).
  void ClearUploads() {
    absl::MutexLock lock(&mu_);
    uploaded_.clear();
  }

  grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* Join(
      grpc::CallbackServerContext* context) override {
    auto session = std::make_unique<Session>(this);
    Session* raw = session.get();
    absl::MutexLock lock(&mu_);
    all_sessions_.push_back(std::move(session));
    return raw;
  }

  // Waits until a worker registered as `name`; returns its registration.
  absl::StatusOr<v1::RegisterWorker> WaitRegistered(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto there = [this, &name]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sessions_.count(name) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&there), kFakeCoordinatorTimeout)) {
      return absl::DeadlineExceededError(absl::StrCat(name, " did not register"));
    }
    return registered_[name];
  }

  // Sends `command` to `name`; false if it has no open stream.
  bool Send(const std::string& name, v1::WorkerCommand command) {
    Session* session = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(name);
      if (it == sessions_.end()) return false;
      session = it->second;
    }
    // Outside mu_: gRPC may run reactions (which take mu_) inline on this thread.
    session->Write(std::move(command));
    return true;
  }

  // Ends `name`'s stream from the server side (UNAVAILABLE) and forgets it, as a restarting
  // coordinator would. False if it has no open stream.
  bool Kick(const std::string& name) {
    Session* session = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(name);
      if (it == sessions_.end()) return false;
      session = it->second;
      sessions_.erase(it);
      events_[name].clear();
    }
    session->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator restarting"));
    return true;
  }

  // How many times `name` registered.
  int registrations(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return registrations_[name];
  }

  // Waits until `name` registered at least `n` times.
  bool WaitRegistrations(const std::string& name, int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, &name, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return registrations_[name] >= n && sessions_.count(name) > 0;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kFakeCoordinatorTimeout);
  }

  // The next event `name` sent (in order), waiting for it.
  absl::StatusOr<v1::WorkerEvent> Next(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto any = [this, &name]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_[name].empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), kFakeCoordinatorTimeout)) {
      return absl::DeadlineExceededError(absl::StrCat("no event from ", name));
    }
    v1::WorkerEvent event = std::move(events_[name].front());
    events_[name].pop_front();
    return event;
  }

 private:
  // One Join stream, owned by the coordinator (kept until it is destroyed, after the server).
  // Write() may be called from any thread; a write that races with the end of the stream is
  // either finished before Finish (Finish waits for it) or dropped.
  class Session final : public grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand> {
   public:
    explicit Session(FakeCoordinator* owner) : owner_(owner) { StartRead(&in_); }

    void Write(v1::WorkerCommand command) {
      {
        absl::MutexLock lock(&mu_);
        if (read_done_) return;
        if (writing_) {
          queue_.push_back(std::move(command));
          return;
        }
        writing_ = true;
        out_ = std::move(command);
      }
      StartWrite(&out_);
    }

    // Finishes the stream with `status` unless it is finishing already (no write in flight: the
    // test only ends idle streams).
    void End(const grpc::Status& status) {
      {
        absl::MutexLock lock(&mu_);
        if (finished_) return;
        finished_ = true;
        read_done_ = true;  // no more writes.
      }
      Finish(status);
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        owner_->Remove(name_, this);
        bool finish = false;
        {
          absl::MutexLock lock(&mu_);
          read_done_ = true;
          finish = !writing_ && !finished_;
          if (finish) finished_ = true;
        }
        if (finish) Finish(grpc::Status::OK);
        return;
      }
      if (in_.has_register_()) {
        name_ = in_.register_().name();
        owner_->Register(name_, this, in_.register_());
      } else {
        owner_->Record(name_, std::move(in_));
      }
      in_.Clear();
      StartRead(&in_);
    }

    void OnWriteDone(bool ok) override {
      bool finish = false;
      {
        absl::MutexLock lock(&mu_);
        if (ok && !read_done_ && !queue_.empty()) {
          out_ = std::move(queue_.front());
          queue_.pop_front();
        } else {
          writing_ = false;
          queue_.clear();
          finish = read_done_ && !finished_;
          if (finish) finished_ = true;
        }
      }
      if (finish) {
        Finish(grpc::Status::OK);
      } else if (writing()) {
        StartWrite(&out_);
      }
    }

    void OnDone() override {}

   private:
    bool writing() {
      absl::MutexLock lock(&mu_);
      return writing_;
    }

    FakeCoordinator* const owner_;
    v1::WorkerEvent in_;     // read chain only.
    std::string name_;       // read chain only.
    v1::WorkerCommand out_;  // write chain only.
    absl::Mutex mu_;         // protects the write queue and the flags.
    std::deque<v1::WorkerCommand> queue_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool read_done_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  void Register(const std::string& name, Session* session, const v1::RegisterWorker& reg) {
    absl::MutexLock lock(&mu_);
    sessions_[name] = session;
    registered_[name] = reg;
    ++registrations_[name];
  }
  void Record(const std::string& name, v1::WorkerEvent event) {
    absl::MutexLock lock(&mu_);
    events_[name].push_back(std::move(event));
  }
  void Remove(const std::string& name, Session* session) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(name);
    if (it != sessions_.end() && it->second == session) sessions_.erase(it);
  }

  absl::Mutex mu_;  // protects the sessions, registrations and recorded events.
  std::vector<std::unique_ptr<Session>> all_sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Session*> sessions_ ABSL_GUARDED_BY(mu_);  // open ones, by name.
  std::map<std::string, v1::RegisterWorker> registered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> registrations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<v1::WorkerEvent>> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> uploaded_ ABSL_GUARDED_BY(mu_);  // PutState files by name.
};

}  // namespace pipetrain::worker::testing

#endif  // PIPETRAIN_TESTS_SERVER_WORKER_FAKE_COORDINATOR_H_
