#include "serving/word_pieces.h"

#include <algorithm>

namespace ftbert::serving {
namespace {
// Words whose pieces are kept; past it the cache starts again.
constexpr size_t kWordCache = size_t{1} << 16;

// Bytes of the UTF-8 character that starts with `lead` (1 for ASCII and for a stray byte).
size_t char_bytes(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}
}  // namespace

WordPieces::WordPieces(std::unordered_map<std::string, int32_t> vocab, int32_t unk,
                       std::string prefix, int64_t max_chars, bool lowercase,
                       std::vector<int32_t> before, std::vector<int32_t> after)
    : vocab_(std::move(vocab)), unk_(unk), prefix_(std::move(prefix)), max_chars_(max_chars),
      lowercase_(lowercase), before_(std::move(before)), after_(std::move(after)) {}

bool WordPieces::word_char(unsigned char c) const {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (!lowercase_ && c >= 'A' && c <= 'Z');
}

const std::vector<int32_t>& WordPieces::pieces(std::string_view word) {
  const std::string key(word);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  if (cache_.size() >= kWordCache) cache_.clear();
  std::vector<int32_t> found;
  if (static_cast<int64_t>(word.size()) > max_chars_) {
    found.push_back(unk_);
  } else {
    for (size_t start = 0; start < word.size();) {
      size_t end = word.size();
      int32_t id = -1;
      for (; end > start; --end) {
        key_.assign(start == 0 ? "" : prefix_).append(word.substr(start, end - start));
        if (auto v = vocab_.find(key_); v != vocab_.end()) {
          id = v->second;
          break;
        }
      }
      if (id < 0) {  // no piece starts here: the whole word is unknown
        found.assign(1, unk_);
        break;
      }
      found.push_back(id);
      start = end;
    }
  }
  return cache_.emplace(key, std::move(found)).first->second;
}

std::vector<int32_t> WordPieces::ids(std::string_view text, int64_t max_length, bool cut_left,
                                     bool special_tokens) {
  static const std::vector<int32_t> none;
  const std::vector<int32_t>& before = special_tokens ? before_ : none;
  const std::vector<int32_t>& after = special_tokens ? after_ : none;
  const int64_t room = max_length < 0 ? -1
                                      : max_length - static_cast<int64_t>(before.size() + after.size());
  // Cutting from the right, the words past the room need not be split at all.
  const int64_t enough = !cut_left && room >= 0 ? room : -1;
  std::vector<int32_t> out(before);
  const size_t first = out.size();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = 1;
    if (c == ' ') {
      ++i;
      continue;
    }
    if (word_char(c)) {
      while (i + n < text.size() && word_char(static_cast<unsigned char>(text[i + n]))) ++n;
    } else {
      n = std::min(char_bytes(c), text.size() - i);
    }
    const std::vector<int32_t>& p = pieces(text.substr(i, n));
    out.insert(out.end(), p.begin(), p.end());
    i += n;
    if (enough >= 0 && static_cast<int64_t>(out.size() - first) > enough) break;
  }
  const int64_t words = static_cast<int64_t>(out.size() - first);
  if (room >= 0 && room < words) {
    if (cut_left) {
      out.erase(out.begin() + first, out.begin() + first + (words - room));
    } else {
      out.resize(first + room);
    }
  }
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

}  // namespace ftbert::serving
