// The router's one way to fan out: the shard calls of one request run through gRPC's async API
// on a completion queue of the request's own, driven by the thread that handles the request.
// Calls are started at once; Wait() takes their completions on that thread and runs each call's
// continuation there, which may start another call (the next replica). No thread is created and
// no completion crosses threads: the waiting thread is the one gRPC wakes, as it is for a
// synchronous call (each shard call used to run on a std::thread of its own, created and joined
// per request inside an admission worker).
#ifndef TESSERA_SERVER_CLUSTER_FAN_OUT_H_
#define TESSERA_SERVER_CLUSTER_FAN_OUT_H_

#include <functional>
#include <list>
#include <memory>

#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_unary_call.h"
#include "grpcpp/support/status.h"

namespace tessera::cluster {

// Not thread-safe: one thread calls Call and Wait (continuations run inside Wait, on it).
class FanOut {
 public:
  // Begins one asynchronous unary call on `queue` whose Finish reports to `tag` and `*status`;
  // returns what must live until that completion (the call's response reader).
  using Start = std::function<std::shared_ptr<void>(
      grpc::ClientContext* context, grpc::CompletionQueue* queue, void* tag, grpc::Status* status)>;
  // Runs on the waiting thread with the call's status once it has finished.
  using Then = std::function<void(const grpc::Status& status)>;

  FanOut() = default;
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;
  // Shuts the queue down; every call has finished by then (Wait returned, or none was made).
  ~FanOut();

  // Starts a call with `context` (kept until it finishes; its deadline bounds the call).
  void Call(std::unique_ptr<grpc::ClientContext> context, const Start& start, Then then);
  // Returns when no call is in flight, having run every continuation (and the calls those made).
  void Wait();

 private:
  struct InFlight {
    std::unique_ptr<grpc::ClientContext> context;
    std::shared_ptr<void> call;
    grpc::Status status;
    Then then;
  };
  grpc::CompletionQueue queue_;
  std::list<InFlight> in_flight_;  // the tag of a call is its InFlight
};

// A FanOut::Start for the unary method `method` of a generated stub (`&Stub::AsyncSearch`, …):
// clears *response and calls method(context, *request, queue). `request` and `response` must
// live until the call finishes.
template <typename Stub, typename Method, typename Request, typename Response>
FanOut::Start UnaryCall(Stub* stub, Method method, const Request* request, Response* response) {
  return
      [stub, method, request, response](grpc::ClientContext* context, grpc::CompletionQueue* queue,
                                        void* tag, grpc::Status* status) -> std::shared_ptr<void> {
        response->Clear();
        std::shared_ptr<grpc::ClientAsyncResponseReader<Response>> call =
            (stub->*method)(context, *request, queue);
        call->Finish(response, status, tag);
        return call;
      };
}

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_FAN_OUT_H_
