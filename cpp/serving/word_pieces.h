// A BERT tokenizer's ids for ASCII text its normalizer has already cleaned (and lower-cased where
// it lower-cases): what the server's fronts run for each text. The text is split as
// BertPreTokenizer splits ASCII (runs of letters and digits; every other character alone; spaces
// dropped), each word into its WordPiece pieces (greedy longest match, the continuation prefix
// after the first piece, the unknown token for a word with no match or longer than max_chars),
// cached by word; then the special tokens around the text and the truncation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ftbert::serving {

class WordPieces {
 public:
  WordPieces(std::unordered_map<std::string, int32_t> vocab, int32_t unk, std::string prefix,
             int64_t max_chars, bool lowercase, std::vector<int32_t> before,
             std::vector<int32_t> after);

  // At most max_length ids (specials included; < 0: no limit), cut from the right or the left as
  // the tokenizer's truncation cuts; nothing is cut where the specials alone pass max_length.
  std::vector<int32_t> ids(std::string_view text, int64_t max_length, bool cut_left,
                           bool special_tokens);

 private:
  const std::vector<int32_t>& pieces(std::string_view word);
  bool word_char(unsigned char c) const;

  std::unordered_map<std::string, int32_t> vocab_;
  int32_t unk_;
  std::string prefix_;
  int64_t max_chars_;
  bool lowercase_;
  std::vector<int32_t> before_, after_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
  std::string key_;  // a piece with its prefix, looked up without allocating each time
};

}  // namespace ftbert::serving
