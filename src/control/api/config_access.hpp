// Which configuration files a CLI caller may have spillwayd read
// (config check|reload PATH), and what of a rejected file it may be told.
//
// spillwayd runs as root; a socket-group member naming a path must not turn
// that into a way to read files it could not read itself. So a caller other
// than root names only files under the running configuration's directory
// (the path as given and the path its symbolic links resolve to), and a
// caller that could not read the file itself (its mode bits and the search
// bits of every directory above it, against the caller's uid, gid and
// supplementary groups) is told where each error is (line, column, field)
// and never a value or a message, which may quote the file. POSIX ACLs are
// not consulted: a file readable only through an ACL counts as unreadable,
// which withholds more, never less.
//
// Thread contract: pure functions of the file system; the control thread
// calls them.
#pragma once

#include <string>
#include <vector>

#include "control/api/control_api.hpp"
#include "control/config/config.hpp"

namespace spillway {

// "" when `caller` may have `path` read, else why not (naming the path and
// the directory, never the file's contents). On success `resolved` is the
// path with symbolic links resolved (equal to `path` for root, which may name
// any file).
[[nodiscard]] std::string configPathProblem(const std::string& path, const std::string& configDir,
                                            const PeerCredentials& caller, std::string& resolved);

// Whether `caller` could read `path` itself (false when it does not exist).
[[nodiscard]] bool callerMayRead(const std::string& path, const PeerCredentials& caller);

// formatErrors() without values and messages: "file:line:column: field"
// per error, except errors about the file as a whole (line 0: cannot open,
// not a regular file, too large), whose messages quote nothing of it.
[[nodiscard]] std::string formatErrorsWithheld(const std::vector<ConfigError>& errors);

}  // namespace spillway
