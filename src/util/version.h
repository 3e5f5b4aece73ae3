// clef.cpp's version: `clef --version`, GET /api/version. Keep it equal to project(VERSION) in
// CMakeLists.txt.
#pragma once

namespace clef {

inline constexpr const char* kClefVersion = "0.1.0";

}  // namespace clef
