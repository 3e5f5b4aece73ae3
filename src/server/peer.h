// Whether the client of an HTTP request is still connected. cpp-httplib 0.11 gives handlers no access to the
// socket, so the connection is found among this process's descriptors by its address pair and peeked at.
#pragma once

#include <string>

namespace clef {

// False when the peer has closed or reset the connection; true when it is open or cannot be determined.
bool peer_connected(const std::string& remote_addr, int remote_port, int local_port);

}  // namespace clef
