#include "control/intent/intent_journal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "control/sys/durable_file.hpp"
#include "control/sys/le_bytes.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

constexpr const char* kJournalName = "intent.journal";
constexpr const char* kSnapshotName = "intent.snapshot";
// A journal grows past kCompactBytes only while compaction fails; beyond
// this, the file is not read (reported as unreadable).
constexpr std::uint64_t kMaxReadBytes = std::uint64_t{64} << 20;

void putString(std::string& out, const std::string& s) {
  putLe(out, s.size(), 2);
  out += s;
}

// A bounds-checked little-endian reader over a record body.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool get(std::uint64_t& v, int bytes) {
    if (pos_ + bytes > b_.size()) return false;
    v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= std::uint64_t{static_cast<std::uint8_t>(b_[pos_ + i])} << (8 * i);
    }
    pos_ += bytes;
    return true;
  }
  bool getString(std::string& s) {
    std::uint64_t n = 0;
    if (!get(n, 2) || pos_ + n > b_.size()) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool getBytes(std::byte* out, std::size_t n) {
    if (pos_ + n > b_.size()) return false;
    std::memcpy(out, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  [[nodiscard]] bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
};

std::optional<IntentRecord> decodeBody(std::span<const std::byte> body) {
  Reader r(body);
  IntentRecord rec;
  std::uint64_t v = 0, flags = 0;
  if (!r.get(rec.seq, 8) || !r.get(v, 8)) return std::nullopt;
  rec.wallMs = static_cast<std::int64_t>(v);
  if (!r.get(v, 1) || v < 1 || v > static_cast<std::uint64_t>(IntentOp::LbUndrain)) {
    return std::nullopt;
  }
  rec.op = static_cast<IntentOp>(v);
  if (!r.get(flags, 1) || !r.getString(rec.backend) || !r.get(rec.id, 8)) return std::nullopt;
  if (!r.get(v, 4)) return std::nullopt;
  rec.weight = static_cast<std::uint32_t>(v);
  if (!r.get(v, 4)) return std::nullopt;
  rec.baseWeight = static_cast<std::uint32_t>(v);
  if (rec.op == IntentOp::Add) {
    if (!r.get(v, 1) || (v != 4 && v != 6)) return std::nullopt;
    rec.address.version = v == 4 ? IpVersion::V4 : IpVersion::V6;
    if (!r.getBytes(rec.address.bytes.data(), rec.address.bytes.size())) return std::nullopt;
    if (!r.getString(rec.pool) || !r.getString(rec.port)) return std::nullopt;
    if (flags & 1) {
      MacAddress mac{};
      if (!r.getBytes(reinterpret_cast<std::byte*>(mac.data()), mac.size())) return std::nullopt;
      rec.mac = mac;
    }
  }
  if (!r.done()) return std::nullopt;
  return rec;
}

// The whole of a regular file, at most kMaxReadBytes; std::nullopt (with
// `error`) when it cannot be read; an empty string when it does not exist.
std::optional<std::string> readFile(const std::string& path, std::string& error) {
  auto text = readStateFile(path, kMaxReadBytes, error);
  if (!text && error.empty()) return std::string();
  return text;
}

std::span<const std::byte> asBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::int64_t wallNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string_view toString(IntentOp op) noexcept {
  switch (op) {
    case IntentOp::Add:
      return "add";
    case IntentOp::Remove:
      return "remove";
    case IntentOp::Drain:
      return "drain";
    case IntentOp::Undrain:
      return "undrain";
    case IntentOp::Disable:
      return "disable";
    case IntentOp::Enable:
      return "enable";
    case IntentOp::Weight:
      return "weight";
    case IntentOp::ClearOverrides:
      return "clear-overrides";
    case IntentOp::Checkpoint:
      return "checkpoint";
    case IntentOp::LbDrain:
      return "lb-drain";
    case IntentOp::LbUndrain:
      return "lb-undrain";
  }
  return "unknown";
}

std::string_view toString(IntentDamage::Kind kind) noexcept {
  switch (kind) {
    case IntentDamage::Kind::TornTail:
      return "torn_tail";
    case IntentDamage::Kind::Corrupt:
      return "corrupt_record";
    case IntentDamage::Kind::CorruptSnapshot:
      return "corrupt_snapshot";
    case IntentDamage::Kind::Unreadable:
      return "unreadable";
  }
  return "unknown";
}

std::string encodeIntentRecord(const IntentRecord& r) {
  std::string body;
  putLe(body, r.seq, 8);
  putLe(body, static_cast<std::uint64_t>(r.wallMs), 8);
  putLe(body, static_cast<std::uint8_t>(r.op), 1);
  putLe(body, r.op == IntentOp::Add && r.mac ? 1 : 0, 1);
  putString(body, r.backend.substr(0, 0xFFFF));
  putLe(body, r.id, 8);
  putLe(body, r.weight, 4);
  putLe(body, r.baseWeight, 4);
  if (r.op == IntentOp::Add) {
    putLe(body, r.address.version == IpVersion::V4 ? 4 : 6, 1);
    body.append(reinterpret_cast<const char*>(r.address.bytes.data()), r.address.bytes.size());
    putString(body, r.pool.substr(0, 0xFFFF));
    putString(body, r.port.substr(0, 0xFFFF));
    if (r.mac) body.append(reinterpret_cast<const char*>(r.mac->data()), r.mac->size());
  }
  std::string out;
  putLe(out, kIntentMagic, 4);
  putLe(out, body.size(), 4);
  putLe(out, crc32c(body), 4);
  return out + body;
}

IntentDecoded decodeIntentRecords(std::span<const std::byte> bytes, std::string_view file) {
  IntentDecoded out;
  std::size_t pos = 0;
  auto damaged = [&](IntentDamage::Kind kind, std::string what) {
    out.damage = IntentDamage{kind, std::string(file), pos, bytes.size() - pos, std::move(what)};
  };
  while (pos < bytes.size()) {
    const auto rest = bytes.subspan(pos);
    if (std::all_of(rest.begin(), rest.end(), [](std::byte b) { return b == std::byte{0}; })) {
      damaged(IntentDamage::Kind::TornTail,
              std::to_string(rest.size()) + " zero bytes after the last whole record");
      break;
    }
    if (rest.size() < kIntentHeaderBytes) {
      damaged(IntentDamage::Kind::TornTail,
              "the last record's header is cut short (" + std::to_string(rest.size()) + " bytes)");
      break;
    }
    Reader h(rest.first(kIntentHeaderBytes));
    std::uint64_t magic = 0, length = 0, crc = 0;
    (void)h.get(magic, 4);
    (void)h.get(length, 4);
    (void)h.get(crc, 4);
    if (magic != kIntentMagic) {
      damaged(IntentDamage::Kind::Corrupt, "bad magic");
      break;
    }
    if (length < kIntentMinBody || length > kMaxIntentBody) {
      damaged(IntentDamage::Kind::Corrupt, "impossible record length " + std::to_string(length));
      break;
    }
    if (rest.size() < kIntentHeaderBytes + length) {
      damaged(IntentDamage::Kind::TornTail,
              "the last record is cut short (" + std::to_string(rest.size()) + " of " +
                  std::to_string(kIntentHeaderBytes + length) + " bytes)");
      break;
    }
    const auto body = rest.subspan(kIntentHeaderBytes, length);
    if (crc32c(std::string_view(reinterpret_cast<const char*>(body.data()), body.size())) != crc) {
      damaged(IntentDamage::Kind::Corrupt, "checksum mismatch");
      break;
    }
    auto rec = decodeBody(body);
    if (!rec) {
      damaged(IntentDamage::Kind::Corrupt, "malformed record body");
      break;
    }
    out.records.push_back(std::move(*rec));
    pos += kIntentHeaderBytes + length;
    out.goodBytes = pos;
  }
  return out;
}

// --- IntentOverlay -------------------------------------------------------------

void IntentOverlay::apply(const IntentRecord& r) {
  const IntentStamp stamp{r.seq, r.wallMs};
  if (r.op == IntentOp::Checkpoint) return;
  if (r.op == IntentOp::LbDrain) {
    if (!lbDrained_) lbDrained_ = stamp;  // a repeated drain keeps its start
    return;
  }
  if (r.op == IntentOp::LbUndrain) {
    lbDrained_.reset();
    return;
  }
  if (r.op == IntentOp::ClearOverrides) {
    if (r.backend.empty()) {
      backends_.clear();
    } else {
      backends_.erase(r.backend);
    }
    return;
  }
  if (r.op == IntentOp::Add) {
    BackendOverride o;
    o.name = r.backend;
    o.id = r.id;
    o.added = r;
    backends_[r.backend] = std::move(o);
    return;
  }
  BackendOverride& o = backends_[r.backend];
  o.name = r.backend;
  o.id = r.id;
  switch (r.op) {
    case IntentOp::Remove:
      o.removed = stamp;
      o.admin.reset();
      o.adminStamp = {};
      if (!o.added) {
        o.weight.reset();
        o.weightStamp = {};
        o.weightReplaced = 0;
      }
      break;
    case IntentOp::Drain:
      o.admin = AdminState::Draining;
      o.adminStamp = stamp;
      break;
    case IntentOp::Undrain:
    case IntentOp::Enable:
    case IntentOp::Disable:
      o.removed.reset();
      o.admin = r.op == IntentOp::Disable ? AdminState::Disabled : AdminState::Enabled;
      o.adminStamp = stamp;
      break;
    case IntentOp::Weight:
      o.weight = r.weight;
      o.weightReplaced = r.baseWeight;
      o.weightStamp = stamp;
      break;
    default:
      break;
  }
}

const BackendOverride* IntentOverlay::find(const std::string& name) const {
  auto it = backends_.find(name);
  return it == backends_.end() ? nullptr : &it->second;
}

std::vector<IntentRecord> IntentOverlay::toRecords() const {
  std::vector<IntentRecord> out;
  for (const auto& entry : backends_) {
    // Not the structured bindings themselves: clang 14 (the fuzz build)
    // cannot capture them in a lambda.
    const std::string& name = entry.first;
    const BackendOverride& o = entry.second;
    auto base = [&](IntentOp op, IntentStamp s) {
      IntentRecord r;
      r.seq = s.seq;
      r.wallMs = s.wallMs;
      r.op = op;
      r.backend = name;
      r.id = o.id;
      return r;
    };
    if (o.added) out.push_back(*o.added);
    if (o.removed) out.push_back(base(IntentOp::Remove, *o.removed));
    if (o.admin) {
      const IntentOp op = *o.admin == AdminState::Draining   ? IntentOp::Drain
                          : *o.admin == AdminState::Disabled ? IntentOp::Disable
                                                             : IntentOp::Enable;
      out.push_back(base(op, o.adminStamp));
    }
    if (o.weight) {
      IntentRecord r = base(IntentOp::Weight, o.weightStamp);
      r.weight = *o.weight;
      r.baseWeight = o.weightReplaced;
      out.push_back(r);
    }
  }
  if (lbDrained_) {
    IntentRecord r;
    r.seq = lbDrained_->seq;
    r.wallMs = lbDrained_->wallMs;
    r.op = IntentOp::LbDrain;
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const IntentRecord& a, const IntentRecord& b) { return a.seq < b.seq; });
  return out;
}

// --- IntentJournal -------------------------------------------------------------

IntentJournal::IntentJournal(std::string dir) : dir_(std::move(dir)) {}

IntentJournal::~IntentJournal() {
  if (fd_ >= 0) ::close(fd_);
}

std::string IntentJournal::journalPath() const {
  return dir_ + "/" + kJournalName;
}
std::string IntentJournal::snapshotPath() const {
  return dir_ + "/" + kSnapshotName;
}

std::optional<std::string> IntentJournal::openJournalFile() {
  const std::string path = journalPath();
  struct stat st {};
  const bool existed = ::lstat(path.c_str(), &st) == 0;
  if (existed && !S_ISREG(st.st_mode)) return path + " is not a regular file";
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd_ < 0) return "cannot open " + path + ": " + errnoText(errno);
  if (!existed) return syncDirectory(dir_);
  return std::nullopt;
}

bool IntentJournal::open() {
  damage_.clear();
  overlay_ = {};
  lastSeq_ = 0;
  replayed_ = 0;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  usable_ = false;
  if (dir_.empty()) {
    usable_ = true;
    return true;
  }
  auto fail = [&](std::string why) {
    error_ = "state_dir " + dir_ + ": " + why;
    damage_.push_back(IntentDamage{IntentDamage::Kind::Unreadable, dir_, 0, 0, error_});
    return false;
  };
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return fail("cannot create it: " + ec.message());
  if (!std::filesystem::is_directory(dir_, ec)) return fail("not a directory");
  ::chmod(dir_.c_str(), 0750);  // best effort: it may be shared on purpose

  bool needCompact = false;
  std::string error;
  auto snapshot = readFile(snapshotPath(), error);
  if (!snapshot) return fail(error);
  if (!snapshot->empty()) {
    IntentDecoded d = decodeIntentRecords(asBytes(*snapshot), snapshotPath());
    const bool headed = !d.records.empty() && d.records.front().op == IntentOp::Checkpoint &&
                        d.records.front().weight + 1 == d.records.size();
    if (d.damage || !headed) {
      IntentDamage dmg = d.damage.value_or(
          IntentDamage{IntentDamage::Kind::CorruptSnapshot, snapshotPath(), 0, snapshot->size(),
                       "no checkpoint record, or its record count does not match"});
      dmg.kind = IntentDamage::Kind::CorruptSnapshot;
      dmg.what += "; the snapshot is ignored (intent older than the journal is lost)";
      damage_.push_back(std::move(dmg));
      needCompact = true;
    } else {
      lastSeq_ = d.records.front().seq;
      for (std::size_t i = 1; i < d.records.size(); ++i) overlay_.apply(d.records[i]);
      replayed_ += d.records.size() - 1;
    }
  }

  auto journal = readFile(journalPath(), error);
  if (!journal) return fail(error);
  IntentDecoded d = decodeIntentRecords(asBytes(*journal), journalPath());
  journalRecords_ = 0;
  for (const IntentRecord& r : d.records) {
    if (r.seq <= lastSeq_) continue;  // already in the snapshot
    overlay_.apply(r);
    lastSeq_ = r.seq;
    ++replayed_;
    ++journalRecords_;
  }
  journalBytes_ = d.goodBytes;
  if (d.damage) {
    damage_.push_back(*d.damage);
    if (d.damage->kind == IntentDamage::Kind::TornTail) {
      if (::truncate(journalPath().c_str(), static_cast<off_t>(d.goodBytes)) != 0) {
        return fail("cannot cut the torn record off " + journalPath() + ": " + errnoText(errno));
      }
    } else {
      const std::string aside = journalPath() + ".damaged-" + std::to_string(wallNowMs());
      if (::rename(journalPath().c_str(), aside.c_str()) != 0) {
        return fail("cannot move the damaged journal aside: " + errnoText(errno));
      }
      damage_.back().what += "; the journal was moved to " + aside;
      needCompact = true;
    }
  }
  if (auto e = openJournalFile()) return fail(*e);
  if (d.damage && d.damage->kind == IntentDamage::Kind::TornTail && ::fdatasync(fd_) != 0) {
    return fail("cannot fdatasync " + journalPath() + ": " + errnoText(errno));
  }
  usable_ = true;
  error_.clear();
  if (needCompact) {
    if (auto e = compact()) return fail(*e);
  }
  return true;
}

std::optional<std::string> IntentJournal::append(IntentRecord& record) {
  if (!usable_) return "operator intent cannot be saved (" + error_ + ")";
  record.seq = lastSeq_ + 1;
  if (dir_.empty()) {
    overlay_.apply(record);
    lastSeq_ = record.seq;
    return std::nullopt;
  }
  const std::string bytes = encodeIntentRecord(record);
  const std::string path = journalPath();
  if (!writeAllFd(fd_, bytes)) {
    const std::string why = "cannot write " + path + ": " + errnoText(errno);
    if (::ftruncate(fd_, static_cast<off_t>(journalBytes_)) != 0) {
      usable_ = false;
      error_ = why + ", and cannot cut the partial record off: " + errnoText(errno);
      return error_;
    }
    return why;
  }
  if (::fdatasync(fd_) != 0) {
    // After a failed fdatasync the page cache no longer says what is on disk
    // (the PostgreSQL lesson): stop accepting changes until a restart.
    const std::string why = "cannot fdatasync " + path + ": " + errnoText(errno);
    (void)::ftruncate(fd_, static_cast<off_t>(journalBytes_));
    usable_ = false;
    error_ = why;
    return why;
  }
  overlay_.apply(record);
  lastSeq_ = record.seq;
  ++journalRecords_;
  journalBytes_ += bytes.size();
  if (journalRecords_ >= kCompactRecords || journalBytes_ >= kCompactBytes) {
    if (auto e = compact()) error_ = "compaction failed: " + *e;
  }
  return std::nullopt;
}

std::optional<std::string> IntentJournal::compact() {
  if (dir_.empty()) return std::nullopt;
  if (!usable_) return "operator intent cannot be saved (" + error_ + ")";
  const std::vector<IntentRecord> records = overlay_.toRecords();
  IntentRecord head;
  head.op = IntentOp::Checkpoint;
  head.seq = lastSeq_;
  head.wallMs = wallNowMs();
  head.weight = static_cast<std::uint32_t>(records.size());
  std::string bytes = encodeIntentRecord(head);
  for (const IntentRecord& r : records) bytes += encodeIntentRecord(r);

  if (auto e = writeFileDurably(snapshotPath(), bytes)) return e;
  // The snapshot covers every journal record now; a crash before this
  // truncate leaves records that replay skips (seq <= the checkpoint's).
  if (::ftruncate(fd_, 0) != 0 || ::fdatasync(fd_) != 0) {
    return "cannot empty " + journalPath() + ": " + errnoText(errno);
  }
  journalRecords_ = 0;
  journalBytes_ = 0;
  return std::nullopt;
}

std::optional<std::string> IntentJournal::rewrite(IntentOverlay overlay) {
  if (!usable_) return "operator intent cannot be saved (" + error_ + ")";
  overlay_ = std::move(overlay);
  return compact();
}

}  // namespace spillway
