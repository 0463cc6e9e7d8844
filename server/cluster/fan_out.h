// The router's one way to fan out: n asynchronous calls started from the calling thread, and a
// wait until every one has finished. The calls are gRPC callback-API calls, whose completions run
// on gRPC's own threads, so a fan-out over n shards creates no thread (each shard call used to
// run on a std::thread of its own, created and joined per request inside an admission worker).
#ifndef TESSERA_SERVER_CLUSTER_FAN_OUT_H_
#define TESSERA_SERVER_CLUSTER_FAN_OUT_H_

#include <cstddef>
#include <functional>

namespace tessera::cluster {

// Calls start(i, done) for i = 0 … n - 1 on the calling thread, then blocks until each of them
// has called its `done` once (from any thread, possibly before start returns). `start` must not
// block: it begins asynchronous work and hands `done` to its completion. What that work uses
// (requests, responses, client contexts) must outlive FanOut, which returns after the last
// `done`; `done` itself may outlive FanOut (it keeps what it needs alive), so a completion may
// call it as its last act without racing the caller's return.
void FanOut(size_t n, const std::function<void(size_t i, std::function<void()> done)>& start);

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_FAN_OUT_H_
