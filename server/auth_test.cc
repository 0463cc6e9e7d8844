#include "server/auth.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/ingest.pb.h"
#include "tessera/v1/query.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Hex(const Sha256& hash) {
  std::string out;
  for (uint8_t byte : hash) absl::StrAppend(&out, absl::Hex(byte, absl::kZeroPad2));
  return out;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> LoadText(const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/auth_test_keys_", ::getpid());
  std::ofstream(path) << text;
  absl::StatusOr<std::unique_ptr<ApiKeys>> keys = ApiKeys::Load(path);
  std::remove(path.c_str());
  return keys;
}

TEST(HashKey, IsSha256) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(Hex(HashKey("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(HashKey("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ApiKeys, ChecksKeysByHashScopeAndMethod) {
  auto keys =
      LoadText(absl::StrCat("# keys\nsha256:", Hex(HashKey("r")), " read name=r\n",
                            "sha256:", absl::AsciiStrToUpper(Hex(HashKey("w"))),
                            "  read,write   # writer\n", "sha256:", Hex(HashKey("a")), " admin\n"));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->size(), 3u);
  constexpr char kSearch[] = "/tessera.v1.QueryService/Search";
  constexpr char kUpsert[] = "/tessera.v1.IngestService/Upsert";
  constexpr char kCreate[] = "/tessera.v1.AdminService/CreateCollection";
  EXPECT_TRUE((*keys)->Authorize("Bearer r", kSearch).ok());
  EXPECT_TRUE((*keys)->Authorize("Bearer w", kUpsert).ok());
  EXPECT_TRUE((*keys)->Authorize("Bearer a", kCreate).ok());
  EXPECT_TRUE((*keys)->Authorize("Bearer a", "/grpc.health.v1.Health/Check").ok());

  absl::Status status = (*keys)->Authorize("Bearer r", kUpsert);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(),
            absl::StrCat("the API key 'r' has scope 'read', ", kUpsert, " needs 'write'"));
  status = (*keys)->Authorize("Bearer w", kCreate);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  // Unnamed keys are labelled by the start of their hash, never by the key.
  EXPECT_THAT(status.message(), HasSubstr(Hex(HashKey("w")).substr(0, 12)));
  EXPECT_EQ((*keys)->Authorize("", kSearch).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*keys)->Authorize("r", kSearch).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*keys)->Authorize("Bearer x", kSearch).code(), absl::StatusCode::kUnauthenticated);
  // The stored hash is not a key.
  EXPECT_EQ((*keys)->Authorize(absl::StrCat("Bearer sha256:", Hex(HashKey("r"))), kSearch).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(ApiKeys, RejectsMalformedFilesNamingTheLineWithoutEchoingAKey) {
  const std::string hash = absl::StrCat("sha256:", Hex(HashKey("k")));
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"s3cret-key read\n", ":1: the first field must be sha256:<64 hex digits>"},
      {"\n" + hash.substr(0, 70) + " read\n", ":2: the first field must be sha256:"},
      {hash.substr(0, 70) + "zz read\n", ":1: the first field must be sha256:"},
      {hash + "\n", ":1: expected 'sha256:HASH SCOPES [name=NAME] [rate=N]'"},
      {hash + " read,own\n", ":1: scope 'own', expected read, write or admin"},
      {hash + " read rate=0\n", ":1: rate '0', expected calls per second > 0"},
      {hash + " read rate=fast\n", ":1: rate 'fast', expected calls per second > 0"},
      {hash + " read colour=red\n", ":1: 'colour=red', expected name=NAME or rate=N"},
      {hash + " read\n" + hash + " admin\n", ":2: the same key appears twice"},
      {"# nothing\n\n", "holds no keys"},
  };
  for (const Case& c : cases) {
    const auto keys = LoadText(c.text);
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(keys.status().message(), HasSubstr(c.message)) << c.text;
    EXPECT_THAT(keys.status().message(), Not(HasSubstr("s3cret")));
  }
  EXPECT_EQ(ApiKeys::Load("/nonexistent/keys").status().code(), absl::StatusCode::kNotFound);
}

// Every method of every tessera.v1 service has the scope written here, so an RPC added to a
// proto without deciding its scope fails this test (and needs admin meanwhile).
TEST(RequiredScope, NamesEveryMethodOfEveryService) {
  const std::map<std::string, Scope> expected = {
      {"/tessera.v1.AdminService/CreateCollection", Scope::kAdmin},
      {"/tessera.v1.AdminService/DropCollection", Scope::kAdmin},
      {"/tessera.v1.AdminService/ListCollections", Scope::kRead},
      {"/tessera.v1.AdminService/GetCollection", Scope::kRead},
      {"/tessera.v1.AdminService/Flush", Scope::kWrite},
      {"/tessera.v1.AdminService/CreateSnapshot", Scope::kAdmin},
      {"/tessera.v1.AdminService/ListSnapshots", Scope::kRead},
      {"/tessera.v1.AdminService/DeleteSnapshot", Scope::kAdmin},
      {"/tessera.v1.AdminService/DownloadSnapshot", Scope::kAdmin},
      {"/tessera.v1.AdminService/RestoreSnapshot", Scope::kAdmin},
      {"/tessera.v1.IngestService/Upsert", Scope::kWrite},
      {"/tessera.v1.IngestService/Delete", Scope::kWrite},
      {"/tessera.v1.IngestService/Get", Scope::kRead},
      {"/tessera.v1.QueryService/Search", Scope::kRead},
      {"/tessera.v1.QueryService/SearchBatch", Scope::kRead},
      {"/tessera.v1.QueryService/Count", Scope::kRead},
      {"/tessera.v1.QueryService/Scroll", Scope::kRead},
  };
  int methods = 0;
  for (const google::protobuf::FileDescriptor* file :
       {v1::SearchRequest::descriptor()->file(), v1::UpsertRequest::descriptor()->file(),
        v1::CreateCollectionRequest::descriptor()->file(),
        v1::ShardInfoRequest::descriptor()->file()}) {
    for (int s = 0; s < file->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* service = file->service(s);
      for (int m = 0; m < service->method_count(); ++m) {
        const std::string path =
            absl::StrCat("/", service->full_name(), "/", service->method(m)->name());
        ++methods;
        const auto found = expected.find(path);
        // The internal shard service is not public: admin only.
        const Scope scope = found != expected.end() ? found->second : Scope::kAdmin;
        if (service->name() != "ShardService") {
          EXPECT_NE(found, expected.end()) << path;
        }
        EXPECT_EQ(RequiredScope(path), scope) << path;
      }
    }
  }
  EXPECT_GE(methods, 10);
  EXPECT_EQ(RequiredScope("/grpc.health.v1.Health/Check"), Scope::kRead);
  EXPECT_EQ(RequiredScope("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            Scope::kRead);
  EXPECT_EQ(RequiredScope("/some.Unknown/Method"), Scope::kAdmin);
  EXPECT_EQ(RequiredScope(""), Scope::kAdmin);
}

}  // namespace
}  // namespace tessera::server
