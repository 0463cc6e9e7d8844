#include "index/storage/record_codec.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/float16.h"

namespace tessera::internal {
namespace {

using ::testing::HasSubstr;

DocumentRecord SampleRecord(bool with_layout) {
  DocumentRecord record;
  record.iid = 7;
  record.external_id = std::string("doc\0/7", 6);  // ids are bytes, NULs included
  record.version = 3;
  record.num_tokens = 1030;
  if (with_layout) record.layout = PatchGridLayout{32, 32, 4, 2};
  record.attributes["year"] = int64_t{-2024};
  record.attributes["score"] = 0.125;
  record.attributes["nan"] = std::numeric_limits<double>::quiet_NaN();
  record.attributes["title"] = std::string("Über\0x", 7);
  record.attributes["empty"] = std::string();
  record.member_offsets = {0, 2, 5};
  record.members = {0, 3, 1, 2, 4};
  return record;
}

void ExpectSameRecord(const DocumentRecord& a, const DocumentRecord& b) {
  EXPECT_EQ(a.iid, b.iid);
  EXPECT_EQ(a.external_id, b.external_id);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.num_tokens, b.num_tokens);
  ASSERT_EQ(a.layout.has_value(), b.layout.has_value());
  if (a.layout.has_value()) {
    EXPECT_EQ(a.layout->rows, b.layout->rows);
    EXPECT_EQ(a.layout->cols, b.layout->cols);
    EXPECT_EQ(a.layout->prefix_tokens, b.layout->prefix_tokens);
    EXPECT_EQ(a.layout->suffix_tokens, b.layout->suffix_tokens);
  }
  ASSERT_EQ(a.attributes.size(), b.attributes.size());
  for (const auto& [name, value] : a.attributes) {
    const auto it = b.attributes.find(name);
    ASSERT_NE(it, b.attributes.end()) << name;
    ASSERT_EQ(value.index(), it->second.index()) << name;
    if (const auto* d = std::get_if<double>(&value)) {
      // Bit-exact, NaN included.
      EXPECT_EQ(absl::bit_cast<uint64_t>(*d),
                absl::bit_cast<uint64_t>(std::get<double>(it->second)))
          << name;
    } else {
      EXPECT_TRUE(value == it->second) << name;
    }
  }
  EXPECT_EQ(a.member_offsets, b.member_offsets);
  EXPECT_EQ(a.members, b.members);
}

StoredMatrix Fp16Matrix(int64_t rows, int64_t cols) {
  StoredMatrix m;
  m.dtype = VectorDtype::kFloat16;
  m.rows = rows;
  m.cols = cols;
  std::vector<Float16> halves;
  for (int64_t i = 0; i < rows * cols; ++i) {
    halves.push_back(FloatToHalf(std::sin(static_cast<float>(i))));
  }
  m.bytes.assign(reinterpret_cast<const char*>(halves.data()), halves.size() * 2);
  return m;
}

StoredMatrix Fp32Matrix(int64_t rows, int64_t cols) {
  StoredMatrix m;
  m.rows = rows;
  m.cols = cols;
  std::vector<float> values;
  for (int64_t i = 0; i < rows * cols; ++i) values.push_back(std::cos(static_cast<float>(i)));
  m.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  return m;
}

// Recomputes the trailing CRC so that a mutated value reaches the payload parser.
std::string Reseal(std::string value) {
  if (value.size() < 4) return value;
  const size_t body = value.size() - 4;
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(value.data()), body));
  for (int i = 0; i < 4; ++i) value[body + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  return value;
}

TEST(RecordCodec, IidKeysSortNumerically) {
  std::vector<uint64_t> iids = {0,
                                1,
                                2,
                                255,
                                256,
                                65535,
                                65536,
                                uint64_t{1} << 32,
                                std::numeric_limits<uint64_t>::max() - 1,
                                std::numeric_limits<uint64_t>::max()};
  std::vector<std::string> keys;
  for (uint64_t iid : iids) {
    keys.push_back(EncodeIidKey(iid));
    ASSERT_EQ(keys.back().size(), 8u);
    uint64_t decoded = 0;
    ASSERT_TRUE(DecodeIidKey(keys.back(), &decoded));
    EXPECT_EQ(decoded, iid);
  }
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_EQ(EncodeIidKey(0x0102030405060708), std::string("\x01\x02\x03\x04\x05\x06\x07\x08"));
  uint64_t ignored;
  EXPECT_FALSE(DecodeIidKey("1234567", &ignored));
  EXPECT_FALSE(DecodeIidKey("123456789", &ignored));
}

TEST(RecordCodec, DocumentRoundTripWithAndWithoutLayout) {
  for (bool with_layout : {true, false}) {
    const DocumentRecord record = SampleRecord(with_layout);
    const std::string value = EncodeDocumentRecord(record);
    EXPECT_EQ(static_cast<uint8_t>(value[0]), kRecordFormatVersion);
    EXPECT_EQ(static_cast<uint8_t>(value[1]), static_cast<uint8_t>(RecordKind::kPackedDocument));
    auto decoded = DecodeDocumentRecord(value, record.iid);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectSameRecord(record, *decoded);
    EXPECT_EQ(EncodeDocumentRecord(*decoded), value);
  }
}

// A record with a sparse vector round-trips it; one without encodes exactly as before sparse
// vectors existed (the bytes a sparse vector adds are its own trailing section), so stored
// records read unchanged and a truncated sparse section is refused.
TEST(RecordCodec, SparseVectorRoundTripsAndIsAnOptionalTrailingSection) {
  DocumentRecord record = SampleRecord(true);
  const std::string without = EncodeDocumentRecord(record);
  record.sparse = SparseVector{{3, 17, 4000000000u}, {1.0f, 0.0f, 2.5f}};
  const std::string with = EncodeDocumentRecord(record);
  EXPECT_EQ(with.size(), without.size() + 1 + 4 + 3 * 8);
  EXPECT_EQ(with.substr(0, without.size() - 4), without.substr(0, without.size() - 4));
  auto decoded = DecodeDocumentRecord(with, record.iid);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(decoded->sparse.has_value());
  EXPECT_EQ(decoded->sparse->indices, record.sparse->indices);
  EXPECT_EQ(decoded->sparse->values, record.sparse->values);
  auto plain = DecodeDocumentRecord(without, record.iid);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->sparse.has_value());
}

// A docs value of `kind` for iid 7 (external id "x", version 1, 4 tokens, no layout, no
// attributes) whose membership section is `membership`, sealed.
std::string DocumentBytes(RecordKind kind, const std::string& membership) {
  std::string value;
  value.push_back(static_cast<char>(kRecordFormatVersion));
  value.push_back(static_cast<char>(kind));
  const auto put = [&value](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) value.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(7, 8);  // iid
  put(1, 4);  // external id length
  value += "x";
  put(1, 8);  // version
  put(4, 8);  // num_tokens
  put(0, 1);  // no layout
  put(0, 4);  // no attributes
  value += membership;
  return Reseal(value + std::string(4, '\0'));
}

// Records written before the membership took varints (kDocument, u32 arrays) read as they were;
// the same record encodes, canonically, to the varint form.
TEST(RecordCodec, DocumentsWithFixedWidthMembershipStillRead) {
  const std::string fixed(
      "\x02\0\0\0"
      "\0\0\0\0"
      "\x02\0\0\0"  // offsets {0, 2}
      "\x02\0\0\0"
      "\x01\0\0\0"
      "\0\0\0\0",  // members {1, 0}
      24);
  const absl::StatusOr<DocumentRecord> old =
      DecodeDocumentRecord(DocumentBytes(RecordKind::kDocument, fixed), 7);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->member_offsets, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(old->members, (std::vector<int32_t>{1, 0}));
  // Counts 2 and deltas zigzagged: offsets 0 → 0, +2 → 4; members +1 → 2, −1 → 1.
  const std::string packed =
      DocumentBytes(RecordKind::kPackedDocument, std::string("\x02\x00\x04\x02\x02\x01", 6));
  EXPECT_EQ(EncodeDocumentRecord(*old), packed);
  const absl::StatusOr<DocumentRecord> again = DecodeDocumentRecord(packed, 7);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameRecord(*old, *again);
}

// The varint membership: a 128-token document pooled in pairs takes a fraction of the u32
// arrays' 772 bytes, any int32 values round-trip (deltas of up to 2^32 in 5-byte varints), and
// a membership that is truncated, not minimal, or leaves int32 is DATA_LOSS naming its field.
TEST(RecordCodec, PackedMembershipIsSmallExactAndChecked) {
  DocumentRecord record = SampleRecord(false);
  record.member_offsets.clear();
  record.members.clear();
  for (int32_t cluster = 0; cluster < 64; ++cluster) {
    record.member_offsets.push_back(2 * cluster);
    record.members.push_back((cluster * 37) % 128);
    record.members.push_back((cluster * 37 + 64) % 128);
  }
  record.member_offsets.push_back(128);
  DocumentRecord fixed_width = record;
  fixed_width.member_offsets.clear();
  fixed_width.members.clear();
  const size_t packed_size = EncodeDocumentRecord(record).size();
  const size_t empty_size = EncodeDocumentRecord(fixed_width).size();
  EXPECT_LE(packed_size - empty_size, 2 + 65 + 128 * 2) << "u32 arrays: " << 8 + 193 * 4;
  auto decoded = DecodeDocumentRecord(EncodeDocumentRecord(record), record.iid);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameRecord(record, *decoded);

  record.member_offsets = {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
                           0, -1, std::numeric_limits<int32_t>::max()};
  record.members = {};
  decoded = DecodeDocumentRecord(EncodeDocumentRecord(record), record.iid);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameRecord(record, *decoded);

  const struct {
    std::string membership;
    const char* field;
  } bad[] = {
      {std::string("\x02\x80\x00\x04\x00", 5), "member_offsets"},   // 0 as two bytes
      {std::string("\x03\x00\x04", 3), "member_offsets"},           // a value short
      {std::string("\x00\x01\x80\x80\x80\x80\x10", 7), "members"},  // zigzag 2^32: +2^31
      {std::string("\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 12),
       "members"},  // past 64 bits
  };
  for (const auto& [membership, field] : bad) {
    const auto status =
        DecodeDocumentRecord(DocumentBytes(RecordKind::kPackedDocument, membership), 7).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << field;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("field '", field, "'"))) << status;
  }
}

TEST(RecordCodec, MinimalDocumentRoundTrip) {
  DocumentRecord record;
  record.iid = 1;
  record.external_id = "x";
  auto decoded = DecodeDocumentRecord(EncodeDocumentRecord(record), 1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameRecord(record, *decoded);
}

TEST(RecordCodec, DocumentUnderAnotherIidIsDataLoss) {
  const std::string value = EncodeDocumentRecord(SampleRecord(true));
  const auto decoded = DecodeDocumentRecord(value, 8);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(decoded.status().message(), HasSubstr("docs CF, iid 8"));
}

TEST(RecordCodec, MatrixRoundTripFp16AndFp32) {
  for (const StoredMatrix& m :
       {Fp16Matrix(7, 96), Fp32Matrix(3, 128), Fp32Matrix(0, 128), Fp16Matrix(5, 0)}) {
    ASSERT_TRUE(ValidateMatrix(m, "m").ok());
    const std::string value = EncodeStoredMatrix(m);
    EXPECT_EQ(value.size(), m.bytes.size() + 17 + kRecordOverheadBytes);
    auto decoded = DecodeStoredMatrix(value, "rerank", 4);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->dtype, m.dtype);
    EXPECT_EQ(decoded->rows, m.rows);
    EXPECT_EQ(decoded->cols, m.cols);
    EXPECT_EQ(decoded->bytes, m.bytes);
  }
}

TEST(RecordCodec, ValidateMatrixRejectsBadShapes) {
  StoredMatrix m = Fp32Matrix(2, 3);
  m.bytes.pop_back();
  EXPECT_EQ(ValidateMatrix(m, "doc 'a'").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ValidateMatrix(m, "doc 'a'").message(), HasSubstr("doc 'a'"));
  m = Fp16Matrix(2, 3);
  m.dtype = VectorDtype::kFloat32;  // 12 bytes but fp32 needs 24
  EXPECT_EQ(ValidateMatrix(m, "m").code(), absl::StatusCode::kInvalidArgument);
  m.rows = -1;
  EXPECT_EQ(ValidateMatrix(m, "m").code(), absl::StatusCode::kInvalidArgument);
  m.rows = std::numeric_limits<int64_t>::max();
  m.cols = 3;
  EXPECT_EQ(ValidateMatrix(m, "m").code(), absl::StatusCode::kInvalidArgument);
}

TEST(RecordCodec, SmallValuesRoundTrip) {
  auto iid = DecodeIdValue(EncodeIdValue(123456789012), "a");
  ASSERT_TRUE(iid.ok());
  EXPECT_EQ(*iid, 123456789012u);
  EXPECT_EQ(DecodeIdValue(EncodeIdValue(0), "a").status().code(), absl::StatusCode::kDataLoss);
  auto counter = DecodeCounterValue(EncodeCounterValue(42), "s/x");
  ASSERT_TRUE(counter.ok());
  EXPECT_EQ(*counter, 42u);
  const std::string opaque("\0\1schema\xff", 9);
  auto meta = DecodeMetaValue(EncodeMetaValue(opaque), "schema");
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(*meta, opaque);
}

// A codes pointer (the codes CF's value once the codes moved to a codes segment) round-trips, is
// told apart from the codes themselves, and every damage is DATA_LOSS naming the generation and
// iid.
TEST(RecordCodec, CodesPointerRoundTripsAndIsToldApartFromCodes) {
  const CodesPointer pointer{12, 4096, 4420, 0xdeadbeef};
  const std::string value = EncodeCodesPointer(pointer);
  EXPECT_TRUE(IsCodesPointer(value));
  EXPECT_FALSE(IsCodesPointer(EncodeCodesValue("codes")));
  EXPECT_FALSE(IsRerankPointer(value));
  auto decoded = DecodeCodesPointer(value, 3, 77);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->segment, 12u);
  EXPECT_EQ(decoded->offset, 4096u);
  EXPECT_EQ(decoded->bytes, 4420);
  EXPECT_EQ(decoded->crc, 0xdeadbeefu);
  EXPECT_EQ(DecodeCodesValue(value, 3, 77).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeCodesPointer(EncodeCodesValue("codes"), 3, 77).status().code(),
            absl::StatusCode::kDataLoss);
  const auto empty = DecodeCodesPointer(EncodeCodesPointer(CodesPointer{12, 64, 0, 0}), 3, 77);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] ^= 0x04;
    const auto damaged = DecodeCodesPointer(bad, 3, 77);
    ASSERT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    EXPECT_THAT(damaged.status().message(), HasSubstr("generation 3 iid 77"));
    EXPECT_EQ(DecodeCodesPointer(value.substr(0, i), 3, 77).status().code(),
              absl::StatusCode::kDataLoss)
        << "length " << i;
  }
}

TEST(RecordCodec, KindsAreNotInterchangeable) {
  const std::string matrix = EncodeStoredMatrix(Fp32Matrix(1, 1));
  EXPECT_EQ(DecodeDocumentRecord(matrix, 1).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeIdValue(EncodeCounterValue(5), "a").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(
      DecodeStoredMatrix(EncodeDocumentRecord(SampleRecord(false)), "rerank", 7).status().code(),
      absl::StatusCode::kDataLoss);
}

TEST(RecordCodec, EveryByteFlipAndTruncationIsDetected) {
  const std::string doc = EncodeDocumentRecord(SampleRecord(true));
  const std::string matrix = EncodeStoredMatrix(Fp16Matrix(4, 8));
  for (size_t i = 0; i < doc.size(); ++i) {
    std::string bad = doc;
    bad[i] ^= 0x10;
    const auto decoded = DecodeDocumentRecord(bad, 7);
    ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    EXPECT_THAT(decoded.status().message(), HasSubstr("docs CF, iid 7"));
    EXPECT_EQ(DecodeDocumentRecord(doc.substr(0, i), 7).status().code(),
              absl::StatusCode::kDataLoss)
        << "length " << i;
  }
  for (size_t i = 0; i < matrix.size(); ++i) {
    std::string bad = matrix;
    bad[i] ^= 0x01;
    const auto decoded = DecodeStoredMatrix(bad, "candidates", 9);
    ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    EXPECT_THAT(decoded.status().message(), HasSubstr("candidates CF, iid 9"));
    EXPECT_EQ(DecodeStoredMatrix(matrix.substr(0, i), "rerank", 9).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(RecordCodec, UnknownFormatVersionIsDataLoss) {
  std::string value = EncodeStoredMatrix(Fp32Matrix(1, 2));
  value[0] = 2;
  const auto decoded = DecodeStoredMatrix(Reseal(value), "rerank", 1);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(decoded.status().message(), HasSubstr("format version 2"));
}

TEST(RecordCodec, GarbageShapesWithValidChecksumsAreDataLoss) {
  // A matrix claiming 2^62 × 2^62 values, checksummed, must not overflow or allocate.
  std::string value = EncodeStoredMatrix(Fp32Matrix(1, 1));
  for (int i = 0; i < 8; ++i) value[3 + i] = value[11 + i] = (i == 7 ? 0x40 : 0);
  EXPECT_EQ(DecodeStoredMatrix(Reseal(value), "rerank", 1).status().code(),
            absl::StatusCode::kDataLoss);
  // A document claiming 2^32 - 1 members.
  DocumentRecord record;
  record.iid = 1;
  record.external_id = "a";
  std::string doc = EncodeDocumentRecord(record);
  const size_t members_count = doc.size() - 4 - 4;
  for (int i = 0; i < 4; ++i) doc[members_count + i] = '\xff';
  EXPECT_EQ(DecodeDocumentRecord(Reseal(doc), 1).status().code(), absl::StatusCode::kDataLoss);
}

// Random mutations, resealed or not, must decode to DATA_LOSS or to a value that encodes back to
// exactly the same bytes (the encoding is canonical), and never crash.
TEST(RecordCodec, FuzzedValuesNeverCrash) {
  std::mt19937_64 rng(20240611);
  const std::vector<std::string> seeds = {EncodeDocumentRecord(SampleRecord(true)),
                                          EncodeDocumentRecord(SampleRecord(false)),
                                          EncodeStoredMatrix(Fp16Matrix(3, 4)),
                                          EncodeStoredMatrix(Fp32Matrix(2, 2)),
                                          EncodeIdValue(99),
                                          EncodeCounterValue(3),
                                          EncodeMetaValue("schema")};
  int decoded_ok = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string value = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      const size_t pos = value.empty() ? 0 : rng() % value.size();
      switch (rng() % 6) {
        case 0:
          if (!value.empty()) value[pos] = static_cast<char>(rng());
          break;
        case 1:
          if (!value.empty()) value[pos] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 2:
          value.insert(pos, 1 + rng() % 8, static_cast<char>(rng()));
          break;
        case 3:
          value.erase(pos, 1 + rng() % 8);
          break;
        case 4:
          value.resize(pos);
          break;
        case 5:
          // Plausible-looking big counts.
          if (value.size() >= 4) {
            const size_t at = rng() % (value.size() - 3);
            for (int i = 0; i < 4; ++i) value[at + i] = static_cast<char>(i == 3 ? 0x7f : 0xff);
          }
          break;
      }
    }
    if (rng() % 4 != 0) value = Reseal(value);
    // Pure garbage of random length now and then.
    if (rng() % 16 == 0) {
      value.resize(rng() % 64);
      for (char& c : value) c = static_cast<char>(rng());
      if (rng() % 2 == 0) value = Reseal(value);
    }
    const uint64_t iid = 7 + rng() % 3;
    if (auto doc = DecodeDocumentRecord(value, iid); doc.ok()) {
      ++decoded_ok;
      EXPECT_EQ(EncodeDocumentRecord(*doc), value);
    } else {
      EXPECT_EQ(doc.status().code(), absl::StatusCode::kDataLoss);
    }
    if (auto matrix = DecodeStoredMatrix(value, "rerank", iid); matrix.ok()) {
      ++decoded_ok;
      EXPECT_EQ(EncodeStoredMatrix(*matrix), value);
    } else {
      EXPECT_EQ(matrix.status().code(), absl::StatusCode::kDataLoss);
    }
    if (auto id = DecodeIdValue(value, "x"); id.ok()) {
      EXPECT_EQ(EncodeIdValue(*id), value);
    } else {
      EXPECT_EQ(id.status().code(), absl::StatusCode::kDataLoss);
    }
    if (auto counter = DecodeCounterValue(value, "k"); counter.ok()) {
      EXPECT_EQ(EncodeCounterValue(*counter), value);
    } else {
      EXPECT_EQ(counter.status().code(), absl::StatusCode::kDataLoss);
    }
    if (auto meta = DecodeMetaValue(value, "k"); meta.ok()) {
      EXPECT_EQ(EncodeMetaValue(*meta), value);
    } else {
      EXPECT_EQ(meta.status().code(), absl::StatusCode::kDataLoss);
    }
  }
  // Some mutations keep a parseable value (e.g. a changed attribute byte, resealed).
  EXPECT_GT(decoded_ok, 0);
}

}  // namespace
}  // namespace tessera::internal
