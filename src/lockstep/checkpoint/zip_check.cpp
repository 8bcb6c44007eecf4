#include "zip_check.h"

#include <zlib.h>

#include <cstdint>
#include <optional>

namespace lockstep {
namespace checkpoint {
namespace detail {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfCentralDirectory = 0x06064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kStored = 0;

// Little-endian reads bounded by the buffer: a read past the end means a malformed archive.
class Bytes {
 public:
  Bytes(const char* data, std::size_t size) : data_(reinterpret_cast<const unsigned char*>(data)), size_(size) {}
  std::size_t size() const { return size_; }
  bool has(uint64_t offset, uint64_t length) const { return offset <= size_ && length <= size_ - offset; }
  uint64_t le(uint64_t offset, int width) const {
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = (value << 8) | data_[offset + i];
    return value;
  }
  const unsigned char* at(uint64_t offset) const { return data_ + offset; }

 private:
  const unsigned char* data_;
  std::size_t size_;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

std::optional<uint64_t> find_end_record(const Bytes& bytes) {
  if (bytes.size() < 22) return std::nullopt;
  const uint64_t last = bytes.size() - 22;
  const uint64_t first = last > 0xFFFF ? last - 0xFFFF : 0;
  for (uint64_t pos = last + 1; pos-- > first;) {
    if (bytes.le(pos, 4) == kEndOfCentralDirectory && pos + 22 + bytes.le(pos + 20, 2) == bytes.size()) return pos;
  }
  return std::nullopt;
}

std::string read_directory(const Bytes& bytes, uint64_t end, Directory& dir) {
  dir.entries = bytes.le(end + 10, 2);
  dir.size = bytes.le(end + 12, 4);
  dir.offset = bytes.le(end + 16, 4);
  const bool zip64 = dir.entries == 0xFFFF || dir.size == 0xFFFFFFFF || dir.offset == 0xFFFFFFFF;
  if (!zip64) return "";
  if (end < 20 || bytes.le(end - 20, 4) != kZip64Locator) return "the zip64 locator is missing";
  const uint64_t record = bytes.le(end - 20 + 8, 8);
  if (!bytes.has(record, 56) || bytes.le(record, 4) != kZip64EndOfCentralDirectory) {
    return "the zip64 end-of-central-directory record is missing";
  }
  dir.entries = bytes.le(record + 32, 8);
  dir.size = bytes.le(record + 40, 8);
  dir.offset = bytes.le(record + 48, 8);
  return "";
}

struct Entry {
  std::string name;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed_size = 0;
  uint64_t local_offset = 0;
  uint64_t header_size = 0;
};

std::string read_entry(const Bytes& bytes, uint64_t pos, Entry& entry) {
  if (!bytes.has(pos, 46) || bytes.le(pos, 4) != kCentralHeader) return "a central directory entry is damaged";
  entry.method = static_cast<uint16_t>(bytes.le(pos + 10, 2));
  entry.crc = static_cast<uint32_t>(bytes.le(pos + 16, 4));
  entry.compressed_size = bytes.le(pos + 20, 4);
  uint64_t uncompressed_size = bytes.le(pos + 24, 4);
  const uint64_t name_length = bytes.le(pos + 28, 2);
  const uint64_t extra_length = bytes.le(pos + 30, 2);
  const uint64_t comment_length = bytes.le(pos + 32, 2);
  entry.local_offset = bytes.le(pos + 42, 4);
  entry.header_size = 46 + name_length + extra_length + comment_length;
  if (!bytes.has(pos, entry.header_size)) return "a central directory entry is damaged";
  entry.name.assign(reinterpret_cast<const char*>(bytes.at(pos + 46)), name_length);
  // Zip64 sizes and offsets sit in extra field 0x0001, in this order, only where the 32-bit
  // field holds its all-ones marker.
  const uint64_t extra_end = pos + 46 + name_length + extra_length;
  for (uint64_t extra = pos + 46 + name_length; extra + 4 <= extra_end;) {
    const uint64_t id = bytes.le(extra, 2), length = bytes.le(extra + 2, 2);
    // A field must fit in the entry's extra area: its length is the archive's word, not a bound.
    if (extra + 4 + length > extra_end) return "record " + entry.name + " has a damaged zip64 field";
    uint64_t field = extra + 4;
    if (id == kZip64ExtraId) {
      for (uint64_t* value : {&uncompressed_size, &entry.compressed_size, &entry.local_offset}) {
        if (*value != 0xFFFFFFFF) continue;
        if (field + 8 > extra + 4 + length) return "record " + entry.name + " has a damaged zip64 field";
        *value = bytes.le(field, 8);
        field += 8;
      }
    }
    extra += 4 + length;
  }
  return "";
}

std::string check_record(const Bytes& bytes, const Entry& entry) {
  if (!bytes.has(entry.local_offset, 30) || bytes.le(entry.local_offset, 4) != kLocalHeader) {
    return "record " + entry.name + " has no local header where the directory says";
  }
  const uint64_t start = entry.local_offset + 30 + bytes.le(entry.local_offset + 26, 2) +
                         bytes.le(entry.local_offset + 28, 2);
  if (!bytes.has(start, entry.compressed_size)) return "record " + entry.name + " runs past the end of the file";
  if (entry.method != kStored) return "";  // Only stored records are ours; zlib would inflate the rest.
  const uint32_t crc = static_cast<uint32_t>(crc32_z(0L, bytes.at(start), entry.compressed_size));
  if (crc != entry.crc) return "record " + entry.name + " fails its CRC32 check (the bytes were changed)";
  return "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string check_zip(const char* data, std::size_t size) {
  const Bytes bytes(data, size);
  if (size < 4 || bytes.le(0, 4) != kLocalHeader) {
    return "it is not a zip archive (torch.save's format starts with 'PK\\x03\\x04')";
  }
  const auto end = find_end_record(bytes);
  if (!end) return "the zip end-of-central-directory record is missing, so the file is truncated";
  Directory dir;
  if (auto error = read_directory(bytes, *end, dir); !error.empty()) return error;
  if (!bytes.has(dir.offset, dir.size)) return "the zip central directory lies past the end of the file";
  bool has_pickle = false;
  uint64_t pos = dir.offset;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    Entry entry;
    if (auto error = read_entry(bytes, pos, entry); !error.empty()) return error;
    if (auto error = check_record(bytes, entry); !error.empty()) return error;
    has_pickle = has_pickle || ends_with(entry.name, "data.pkl");
    pos += entry.header_size;
  }
  if (!has_pickle) return "the zip archive holds no data.pkl record, so it was not written by torch.save";
  return "";
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
