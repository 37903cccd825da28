// Error handling: one exception type and one macro family. Errors carry file:line and what was
// expected; pybind11 turns ftbert::Error into a Python exception, so nothing here ever aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ftbert {

// A user-facing problem: bad input, a bad weight file, a backend that is not there.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from the caller (ids out of range, wrong sizes): Python sees a ValueError.
class InputError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] inline void fail(const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << msg << " [" << file << ":" << line << "]";
  throw Error(os.str());
}
// Input errors speak to the caller about their data; no source location.
[[noreturn]] inline void fail_input(const std::string& msg) { throw InputError(msg); }
}  // namespace detail

}  // namespace ftbert

// FTBERT_CHECK(cond, "message " << value): throws ftbert::Error when cond is false.
#define FTBERT_CHECK(cond, msg)                                           \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::ostringstream ftbert_os_;                                      \
      ftbert_os_ << msg;                                                  \
      ::ftbert::detail::fail(__FILE__, __LINE__, ftbert_os_.str());       \
    }                                                                     \
  } while (0)

#define FTBERT_FAIL(msg) FTBERT_CHECK(false, msg)

// FTBERT_CHECK_INPUT(cond, msg): like FTBERT_CHECK, for mistakes in the caller's inputs.
#define FTBERT_CHECK_INPUT(cond, msg)                                     \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::ostringstream ftbert_os_;                                      \
      ftbert_os_ << msg;                                                  \
      ::ftbert::detail::fail_input(ftbert_os_.str());                     \
    }                                                                     \
  } while (0)
