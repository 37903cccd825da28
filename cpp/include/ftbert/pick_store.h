// A small on-disk store for measured choices (e.g. the GEMM kernel picked per shape), so that what
// one process measured the next one reuses. Device-agnostic: the backends decide what the keys,
// values and identity say; this file only keeps them safe across processes and crashes.
//
// File format (text, one entry per line, fields separated by '\t'):
//
//   ftbert-picks \t 1 \t <identity>                 header: magic word, format version, identity
//   <key> \t <value> \t <checksum>                   one line per entry, in key order
//   ...
//   ftbert-picks-end \t <count> \t <checksum>        closing line
//
// An entry's checksum is 64-bit FNV-1a over key + '\t' + value, as 16 lowercase hex digits. The
// closing line holds the number of entries (decimal) and FNV-1a over every byte before it (header
// and entry lines), so a file cut short anywhere, even at a line boundary, fails to check. Every
// line ends in '\n'. The closing line is known by its position (the last line), not its text, so a
// key may be anything without '\n', '\t' or '\r'.
#pragma once

#include <map>
#include <string>

namespace ftbert {

// A file of measured choices that outlive the process: key -> value text entries under a header
// naming the environment they were measured in (its identity).
class PickStore {
 public:
  // `path`: the file (not empty). `identity`: one line (no '\n' or '\r') naming what the entries
  // are valid for (e.g. GPU, driver, library versions, format version); a file written under
  // another identity is foreign. Bad arguments throw InputError.
  PickStore(std::string path, std::string identity);

  // The file's entries. A missing file gives none, silently. A foreign, corrupt (a bad checksum,
  // a malformed or truncated line or file, binary garbage) or unreadable file gives none, with one
  // warning on stderr ("ftbert: warning: ignoring <path>: <what is wrong>"): never trusted in
  // part, never throws.
  std::map<std::string, std::string> load() const;

  // Merges `entries` into the file: entries already there under the same identity are kept (ours
  // win on the same key); a foreign or corrupt file is replaced, silently (load() warned about it).
  // Under an exclusive lock (flock on path + ".lock", which stays) so that two processes storing at
  // once lose nothing; written to a temporary file in the same folder (path + ".tmp") and renamed
  // over, so a reader sees the old or the new file, never part of one. Creates missing folders.
  // On an I/O failure (read-only folder, ...) one warning on stderr ("ftbert: warning: cannot
  // store <path>: ...") and false; never throws for I/O. Keys and values may not contain '\n',
  // '\t' or '\r' (and keys not be empty): InputError says which, before anything is written.
  bool store(const std::map<std::string, std::string>& entries) const;

  const std::string& path() const { return path_; }
  const std::string& identity() const { return identity_; }

  // Where caches go: $FTBERT_CACHE_DIR, else $XDG_CACHE_HOME/ftbert, else $HOME/.cache/ftbert;
  // "" when none can be named. Empty variables count as unset, and so does a relative
  // XDG_CACHE_HOME (the XDG spec says to ignore one).
  static std::string default_dir();

 private:
  std::string path_;
  std::string identity_;
};

}  // namespace ftbert
