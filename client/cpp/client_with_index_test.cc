// The client and the index library in one translation unit: their types that share names
// (SearchOptions, SearchHit, SearchResult, StoredDocument, ...) live in different namespaces, so
// both headers compile together and a program may link both without breaking the one-definition
// rule.
#include <type_traits>

#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "tessera/collection.h"

namespace tessera {
namespace {

TEST(ClientWithIndex, SameNamesAreDistinctTypes) {
  static_assert(!std::is_same_v<client::SearchOptions, SearchOptions>);
  static_assert(!std::is_same_v<client::SearchResult, SearchResult>);
  static_assert(!std::is_same_v<client::StoredDocument, StoredDocument>);
  client::SearchOptions remote;
  SearchOptions local;
  // Defaults that must agree: k, and 0 meaning "the server's default" on both sides.
  EXPECT_EQ(static_cast<int>(remote.k), local.k);
  EXPECT_EQ(static_cast<int>(remote.num_candidates), local.num_candidates);
  EXPECT_EQ(static_cast<int>(remote.nprobe), local.nprobe);
}

}  // namespace
}  // namespace tessera
