// Errors raised by clef.cpp. Every failure that bad input can cause is a clef::Error with a message that names
// the offending file, field or value; nothing else is thrown on purpose.
#pragma once

#include <stdexcept>
#include <string>

namespace clef {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace clef
