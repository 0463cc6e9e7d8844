#include "server/cluster/fan_out.h"

#include <utility>

namespace tessera::cluster {

FanOut::~FanOut() {
  queue_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) {
  }
}

void FanOut::Call(std::unique_ptr<grpc::ClientContext> context, const Start& start, Then then) {
  InFlight& call = in_flight_.emplace_back();
  call.context = std::move(context);
  call.then = std::move(then);
  call.call = start(call.context.get(), &queue_, &call, &call.status);
}

void FanOut::Wait() {
  while (!in_flight_.empty()) {
    void* tag = nullptr;
    bool ok = false;
    // A unary call's Finish always completes (ok is true); the queue is shut down only by the
    // destructor, so Next cannot fail while calls are in flight.
    if (!queue_.Next(&tag, &ok)) return;
    auto finished = in_flight_.begin();
    while (&*finished != tag) ++finished;
    const grpc::Status status = std::move(finished->status);
    Then then = std::move(finished->then);
    in_flight_.erase(finished);
    then(status);
  }
}

}  // namespace tessera::cluster
