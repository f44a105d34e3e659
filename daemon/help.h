// gpumoved --help: the daemon's flags in groups (serving, pools, cluster, paths, security,
// limits), one line each; --helpfull adds each flag's whole text and its default.
#ifndef GPUMOVE_DAEMON_HELP_H_
#define GPUMOVE_DAEMON_HELP_H_

#include <string>
#include <vector>

namespace gpumove {

// Which help `argv` asks for: 0 none, 1 --help (-h, -help, --helpshort), 2 --helpfull.
int HelpAsked(int argc, char** argv);
// The help text for flags defined in `defined_in` (a file name suffix, e.g.
// "daemon/app/flags.cc").
std::string DaemonHelp(const std::string& defined_in, bool full);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_HELP_H_
