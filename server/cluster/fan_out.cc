#include "server/cluster/fan_out.h"

#include <memory>

#include "tessera/base/mutex.h"

namespace tessera::cluster {
namespace {

// Shared by the caller and every `done`, so that the last `done` can still be unlocking it when
// the caller, woken, returns.
struct Pending {
  Mutex mu;
  CondVar finished;
  size_t left ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

void FanOut(size_t n, const std::function<void(size_t i, std::function<void()> done)>& start) {
  auto pending = std::make_shared<Pending>();
  {
    MutexLock lock(&pending->mu);
    pending->left = n;
  }
  for (size_t i = 0; i < n; ++i) {
    start(i, [pending] {
      MutexLock lock(&pending->mu);
      if (--pending->left == 0) pending->finished.SignalAll();
    });
  }
  MutexLock lock(&pending->mu);
  while (pending->left > 0) pending->finished.Wait(&pending->mu);
}

}  // namespace tessera::cluster
