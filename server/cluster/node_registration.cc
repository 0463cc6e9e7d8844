#include "server/cluster/node_registration.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/cluster/cluster_state.h"
#include "server/log.h"

namespace tessera::cluster {

using server::Log;

std::string NodeKey(absl::string_view node_id) { return absl::StrCat(kNodesPrefix, node_id); }

std::string NodeValue(absl::string_view address) {
  return absl::StrCat(R"({"address":")", address, R"(","role":"shard","state":"serving"})");
}

absl::StatusOr<std::unique_ptr<NodeRegistration>> NodeRegistration::Start(
    std::unique_ptr<EtcdClient> etcd, absl::string_view node_id, absl::string_view address) {
  auto registration = std::unique_ptr<NodeRegistration>(
      new NodeRegistration(std::move(etcd), NodeKey(node_id), NodeValue(address)));
  {
    MutexLock lock(&registration->mu_);
    const absl::Status registered = registration->RegisterLocked();
    if (!registered.ok()) return registered;
  }
  registration->thread_ = std::thread([r = registration.get()] { r->Loop(); });
  return registration;
}

NodeRegistration::~NodeRegistration() {
  // Start failed: nothing was registered (RegisterLocked revokes a lease it cannot use) and no
  // thread runs.
  if (!thread_.joinable()) return;
  std::unique_ptr<LeaseKeepAlive> keepalive;
  int64_t lease = 0;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    keepalive = std::move(keepalive_);
    lease = lease_;
  }
  cv_.SignalAll();
  thread_.join();
  keepalive.reset();
  const absl::StatusOr<int64_t> deleted = etcd_->Delete(key_);
  if (!deleted.ok()) {
    Log("warning", "node key not deleted; it expires with its lease",
        {{"key", key_}, {"error", std::string(deleted.status().message())}});
  }
  if (lease != 0) etcd_->RevokeLease(lease).IgnoreError();
  Log("info", "node unregistered", {{"key", key_}});
}

absl::Status NodeRegistration::RegisterLocked() {
  absl::StatusOr<int64_t> lease = etcd_->GrantLease(kNodeLeaseSeconds);
  if (!lease.ok()) return lease.status();
  const absl::StatusOr<int64_t> put = etcd_->Put(key_, value_, *lease);
  if (!put.ok()) {
    etcd_->RevokeLease(*lease).IgnoreError();
    return put.status();
  }
  lease_ = *lease;
  lost_ = false;
  // Runs on the keepalive's thread, at most once.
  keepalive_ = etcd_->KeepAlive(*lease, [this](const absl::Status& status) {
    Log("warning", "node lease lost; registering again",
        {{"error", std::string(status.message())}});
    {
      MutexLock lock(&mu_);
      lost_ = true;
    }
    cv_.SignalAll();
  });
  Log("info", "node registered",
      {{"key", key_}, {"value", value_}, {"lease", std::to_string(*lease)}});
  return absl::OkStatus();
}

void NodeRegistration::Loop() {
  mu_.Lock();
  while (!stop_) {
    while (!stop_ && !lost_) cv_.Wait(&mu_);
    if (stop_) break;
    // The old keepalive's thread has finished reporting; destroying it joins that thread (which
    // takes mu_ to report, hence outside it).
    std::unique_ptr<LeaseKeepAlive> old = std::move(keepalive_);
    mu_.Unlock();
    old.reset();
    mu_.Lock();
    if (stop_) break;
    const absl::Status registered = RegisterLocked();
    if (!registered.ok()) {
      Log("warning", "node registration failed; retrying",
          {{"error", std::string(registered.message())}});
      const absl::Time retry = absl::Now() + absl::Seconds(1);
      while (!stop_ && !cv_.WaitWithTimeout(&mu_, retry - absl::Now())) {
      }
    }
  }
  mu_.Unlock();
}

}  // namespace tessera::cluster
