// Internal Unicode helpers for the tokenizer: UTF-8 validation in "maximal subpart" units, lossy decoding,
// the GPT-2 byte<->code point table, Unicode White_Space and NFC (utf8proc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace clef::tok {

// Length (1..4) of the well-formed UTF-8 sequence starting at s[0], or 0 when s[0..] is ill-formed; then
// `bad` receives the length of the maximal ill-formed subpart (>= 1) that a lossy decoder replaces by one
// U+FFFD (Unicode "substitution of maximal subparts", as Rust's String::from_utf8_lossy does). n must be
// >= 1.
size_t utf8_sequence(const unsigned char* s, size_t n, size_t& bad);

// Decodes the well-formed sequence of length len at s.
uint32_t utf8_decode(const unsigned char* s, size_t len);

// Decodes the code point ending just before s[end] (s[0..end) is valid UTF-8, end > 0); sets its length.
uint32_t utf8_decode_before(const unsigned char* s, size_t end, size_t& len);

void append_utf8(std::string& out, uint32_t cp);

// Bytes -> text, each maximal ill-formed subpart replaced with U+FFFD.
std::string utf8_lossy(std::string_view bytes);

bool is_valid_utf8(std::string_view s);

// Unicode White_Space (stable since Unicode 6.3, when U+180E left it).
bool is_white_space(uint32_t cp);

// Alphabetic-or-numeric approximation used for added tokens with single_word (general categories L*, N*,
// Mn/Mc).
bool is_word_char(uint32_t cp);

// GPT-2 byte-level alphabet: byte b is written as code point byte_to_cp()[b]; cp_to_byte() is the inverse
// (-1 for a code point outside the alphabet).
const std::array<uint32_t, 256>& byte_to_cp();
int cp_to_byte(uint32_t cp);
// UTF-8 text of the byte-level character for byte b.
std::string byte_level_char(uint8_t b);
// Byte-level form of arbitrary bytes (each byte -> its alphabet character).
std::string byte_level_encode(std::string_view bytes);
// Inverse of byte_level_encode; false when `text` holds a character outside the alphabet or is not valid
// UTF-8.
bool byte_level_decode(std::string_view text, std::string& out);

// NFC of valid UTF-8 `in`, appended to out. Throws clef::Error if utf8proc fails.
void nfc_append(std::string_view in, std::string& out);

// NFC of valid UTF-8 `in` that only normalizes where needed. Returns false (out untouched) when `in` is
// already NFC-stable by the check below; otherwise writes the whole normalized text to out (cleared first).
// The text is cut at "inert" code points: ccc = 0, no canonical decomposition, and never the second element
// of a canonical composition. Nothing can combine or reorder across such a character, so each span from an
// inert character up to the next one is normalized on its own; spans made only of the inert character are
// kept.
bool nfc_if_needed(std::string_view in, std::string& out);

}  // namespace clef::tok
