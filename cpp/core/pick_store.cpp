// PickStore: the file format is described in ftbert/pick_store.h. POSIX I/O throughout, for the
// errno of a missing file (silent) against an unreadable one (a warning), flock and rename.
#include "ftbert/pick_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "ftbert/check.h"

namespace ftbert {

namespace {

constexpr std::string_view kMagic = "ftbert-picks";
constexpr std::string_view kVersion = "1";
constexpr std::string_view kEnd = "ftbert-picks-end";
// A pick file holds a few hundred short lines; anything this big is not one (nor read whole).
constexpr size_t kMaxFileBytes = size_t{64} << 20;

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t fnv1a(std::string_view bytes, uint64_t h = kFnvOffset) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnvPrime;
  }
  return h;
}

// The tab between key and value is hashed too, so ("ab", "c") and ("a", "bc") differ.
uint64_t entry_checksum(std::string_view key, std::string_view value) {
  return fnv1a(value, fnv1a("\t", fnv1a(key)));
}

std::string hex16(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 0xf];
  return s;
}

// Exactly 16 lowercase hex digits, as hex16 writes them; anything else is malformed.
bool parse_hex16(std::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (const char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// For messages: control and non-ASCII bytes escaped, long text cut, so a garbage file or a bad key
// prints as one readable line.
std::string printable(std::string_view s, size_t max_chars = 80) {
  std::string out;
  for (const char ch : s) {
    if (out.size() >= max_chars) return out + "...";
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

// The name of the first character that a key or value may not hold, or nullptr.
const char* forbidden_char(std::string_view s) {
  for (const char c : s) {
    if (c == '\n') return "a newline ('\\n')";
    if (c == '\t') return "a tab ('\\t')";
    if (c == '\r') return "a carriage return ('\\r')";
  }
  return nullptr;
}

// One write, so that lines from processes sharing a terminal do not interleave.
void warn(const std::string& what) {
  const std::string line = "ftbert: warning: " + what + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

std::string errno_text(int err) { return std::strerror(err); }

// Closes on scope exit; the lock file's descriptor releases the flock with it.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string dirname_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// mkdir -p. Returns 0, or the errno of the step that failed (with that step in *failed).
int make_dirs(const std::string& dir, std::string* failed) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    const std::string prefix = dir.substr(0, end);
    struct stat st;
    if (::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      const int err = errno;
      *failed = prefix;
      return err;
    }
  }
  return 0;
}

// Splits a line into exactly three '\t'-separated fields; false for any other count.
bool split3(std::string_view line, std::string_view out[3]) {
  const size_t a = line.find('\t');
  if (a == std::string_view::npos) return false;
  const size_t b = line.find('\t', a + 1);
  if (b == std::string_view::npos || line.find('\t', b + 1) != std::string_view::npos) return false;
  out[0] = line.substr(0, a);
  out[1] = line.substr(a + 1, b - a - 1);
  out[2] = line.substr(b + 1);
  return true;
}

// Checks `text` as a whole pick file written under `identity`. Returns "" and fills *entries, or
// says what is wrong (and *entries is left empty: a file is never trusted in part).
std::string parse(const std::string& text, const std::string& identity,
                  std::map<std::string, std::string>* entries) {
  entries->clear();
  if (text.empty()) return "empty file";
  const size_t header_end = text.find('\n');
  if (header_end == std::string::npos) {
    return "no complete header line (truncated, or not a pick file)";
  }
  // Header: magic \t version \t identity (the rest of the line, which may hold tabs).
  const std::string_view header(text.data(), header_end);
  const size_t t1 = header.find('\t');
  if (header.substr(0, t1) != kMagic) {
    return "not an ftbert pick file (no '" + std::string(kMagic) + "' header)";
  }
  const size_t t2 = t1 == std::string_view::npos ? t1 : header.find('\t', t1 + 1);
  if (t2 == std::string_view::npos) return "malformed header line";
  const std::string_view version = header.substr(t1 + 1, t2 - t1 - 1);
  if (version != kVersion) {
    return "format version '" + printable(version) + "' (this build reads " +
           std::string(kVersion) + ")";
  }
  const std::string_view theirs = header.substr(t2 + 1);
  if (theirs != identity) {
    return "written under another identity ('" + printable(theirs, 200) + "'; this process is '" +
           printable(identity, 200) + "')";
  }
  if (text.back() != '\n') return "truncated (the last line is incomplete)";
  if (header_end + 1 == text.size()) return "truncated (no closing line)";

  // Entry lines, up to the last line, which is the closing line.
  const size_t close_start = text.rfind('\n', text.size() - 2) + 1;
  std::map<std::string, std::string> found;
  size_t line_no = 1;
  const auto at_line = [&line_no](const std::string& what) {
    return "line " + std::to_string(line_no) + ": " + what;
  };
  std::string_view f[3];
  uint64_t sum = 0;
  for (size_t pos = header_end + 1; pos < close_start;) {
    ++line_no;
    const size_t end = text.find('\n', pos);
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (!split3(line, f) || f[0].empty() || forbidden_char(f[0]) != nullptr ||
        forbidden_char(f[1]) != nullptr || !parse_hex16(f[2], &sum)) {
      return at_line("malformed entry");
    }
    if (entry_checksum(f[0], f[1]) != sum) return at_line("checksum mismatch");
    if (!found.emplace(std::string(f[0]), std::string(f[1])).second) {
      return at_line("duplicate key '" + printable(f[0]) + "'");
    }
  }
  ++line_no;
  const std::string_view close(text.data() + close_start, text.size() - 1 - close_start);
  // A file cut at a line boundary ends in an entry line.
  if (close.substr(0, close.find('\t')) != kEnd) return "truncated (no closing line)";
  if (!split3(close, f) || !parse_hex16(f[2], &sum)) return at_line("malformed closing line");
  if (f[1] != std::to_string(found.size())) {
    return "the closing line counts '" + printable(f[1]) + "' entries, the file holds " +
           std::to_string(found.size());
  }
  if (fnv1a(std::string_view(text.data(), close_start)) != sum) return "file checksum mismatch";
  *entries = std::move(found);
  return "";
}

std::string serialize(const std::string& identity,
                      const std::map<std::string, std::string>& entries) {
  std::string text;
  const auto line = [&text](std::string_view a, std::string_view b, std::string_view c) {
    text.append(a).append("\t").append(b).append("\t").append(c).append("\n");
  };
  line(kMagic, kVersion, identity);
  for (const auto& [key, value] : entries) line(key, value, hex16(entry_checksum(key, value)));
  line(kEnd, std::to_string(entries.size()), hex16(fnv1a(text)));
  return text;
}

struct ReadResult {
  enum Status { kOk, kMissing, kBad } status = kMissing;
  std::map<std::string, std::string> entries;
  std::string problem;  // kBad: what is wrong
};

ReadResult read_file(const std::string& path, const std::string& identity) {
  ReadResult r;
  const auto bad = [&r](std::string problem) {
    r.status = ReadResult::kBad;
    r.problem = std::move(problem);
    return r;
  };
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT) return r;
    return bad("cannot open: " + errno_text(err));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) {
    const int err = errno;
    return bad("cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) return bad("not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
    return bad("too large to be a pick file (" + std::to_string(st.st_size) + " bytes)");
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      return bad("cannot read: " + errno_text(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    // The file grew past the cap after fstat: still not a pick file.
    if (text.size() > kMaxFileBytes) return bad("too large to be a pick file");
  }
  r.problem = parse(text, identity, &r.entries);
  r.status = r.problem.empty() ? ReadResult::kOk : ReadResult::kBad;
  return r;
}

// Returns 0 or the errno of the failed write.
int write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

PickStore::PickStore(std::string path, std::string identity)
    : path_(std::move(path)), identity_(std::move(identity)) {
  FTBERT_CHECK_INPUT(!path_.empty(), "PickStore: the path is empty");
  FTBERT_CHECK_INPUT(identity_.find_first_of("\n\r") == std::string::npos,
                     "PickStore: the identity must be one line, got '" << printable(identity_)
                                                                         << "'");
}

std::map<std::string, std::string> PickStore::load() const {
  ReadResult r = read_file(path_, identity_);
  if (r.status == ReadResult::kBad) warn("ignoring " + path_ + ": " + r.problem);
  return std::move(r.entries);
}

bool PickStore::store(const std::map<std::string, std::string>& entries) const {
  // Inputs first: a bad key is the caller's mistake and must not half-write anything.
  constexpr const char* kRule = "; keys and values may not contain '\\n', '\\t' or '\\r'";
  for (const auto& [key, value] : entries) {
    FTBERT_CHECK_INPUT(!key.empty(), "PickStore: a key is empty");
    const char* in_key = forbidden_char(key);
    FTBERT_CHECK_INPUT(in_key == nullptr,
                       "PickStore: key '" << printable(key) << "' contains " << in_key << kRule);
    const char* in_value = forbidden_char(value);
    FTBERT_CHECK_INPUT(in_value == nullptr, "PickStore: the value of key '" << printable(key)
                                                << "' contains " << in_value << kRule);
  }
  const auto fail = [this](const std::string& step, int err) {
    warn("cannot store " + path_ + ": " + step + ": " + errno_text(err));
    return false;
  };

  const std::string dir = dirname_of(path_);
  std::string failed_dir;
  if (const int err = make_dirs(dir, &failed_dir); err != 0) {
    return fail("cannot create folder " + failed_dir, err);
  }
  // The lock file stays: removing it would let a process lock an unlinked file while another
  // locks a fresh one.
  const std::string lock_path = path_ + ".lock";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (lock.fd < 0) {
    const int err = errno;
    return fail("cannot open " + lock_path, err);
  }
  int rc;
  do {
    rc = ::flock(lock.fd, LOCK_EX);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    return fail("cannot lock " + lock_path, err);
  }

  // Read under the lock, so that what another process stored a moment ago is merged, not lost.
  ReadResult existing = read_file(path_, identity_);
  std::map<std::string, std::string> merged;
  if (existing.status == ReadResult::kOk) merged = std::move(existing.entries);
  for (const auto& [key, value] : entries) merged[key] = value;
  const std::string text = serialize(identity_, merged);

  // One fixed temporary name: the lock makes this process its only writer, and a crash leaves at
  // most one stale file, which the next store overwrites. No fsync: a file torn by a power loss
  // fails its checksums and is measured again.
  const std::string tmp_path = path_ + ".tmp";
  Fd tmp(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666));
  if (tmp.fd < 0) {
    const int err = errno;
    return fail("cannot create " + tmp_path, err);
  }
  if (const int err = write_all(tmp.fd, text); err != 0) {
    ::unlink(tmp_path.c_str());
    return fail("cannot write " + tmp_path, err);
  }
  const int closed = ::close(tmp.fd);
  tmp.fd = -1;
  if (closed != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    return fail("cannot write " + tmp_path, err);
  }
  if (::rename(tmp_path.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    return fail("cannot rename " + tmp_path + " over it", err);
  }
  return true;
}

std::string PickStore::default_dir() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  if (std::string dir = env("FTBERT_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg[0] == '/') {
    return xdg + "/ftbert";
  }
  if (std::string home = env("HOME"); !home.empty()) return home + "/.cache/ftbert";
  return "";
}

}  // namespace ftbert
