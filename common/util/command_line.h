// The command line of every pipetrain binary (`pipetrain`, `coordinator`, `stage_worker`), on top
// of Abseil flags: flags are still defined the ordinary way (ABSL_FLAG in main.cc) and their
// values parsed by absl::ParseCommandLine; this layer adds what Abseil 20220623 lacks:
//  - names spelt with dashes or underscores (--data-dir, --data_dir), also inside flag files;
//  - --flagfile FILE expanded here (absl's format, plus `--name value` lines), so that flag
//    files obey the same rules as the command line;
//  - per-command help (`pipetrain train --help`, `pipetrain help train`) listing that command's
//    flags, defaults and meaning; --help / --helpfull exit 0;
//  - --version: the program's name, version and git commit (build_info.h), exit 0;
//  - unknown flags and flags the command does not use refused with a "did you mean";
//  - which flags were given (not: which differ from their default).
#ifndef PIPETRAIN_COMMON_UTIL_COMMAND_LINE_H_
#define PIPETRAIN_COMMON_UTIL_COMMAND_LINE_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// One command of a program with commands (`pipetrain train`), or a daemon's whole command line.
struct CommandSpec {
  std::string name;     // "train"; "" for a program without commands.
  std::string args;     // synopsis of its positional arguments, e.g. "JOB"; "" for none.
  std::string summary;  // one line: what it does.
  // Names of the flags it takes, as defined (underscores), in the order --help lists them.
  std::vector<std::string> flags;
  // The default --help shows for a flag (by name, underscores) whose ABSL_FLAG default is not what
  // this command does when the flag is not given: {"stages", "1"} shows "--stages (default: 1)",
  // {"stages", kRequired} shows "--stages (required)". Overrides ProgramSpec::defaults.
  std::map<std::string, std::string> defaults = {};
};

// The CommandSpec::defaults / ProgramSpec::defaults text that shows a flag as required.
inline constexpr char kRequired[] = "required";

// A heading of a help text and what it lists under it: flags (names with underscores) or
// commands, in order.
struct HelpTopic {
  std::string heading;  // "model and data"
  std::vector<std::string> names;
};

// A binary's commands and help texts.
struct ProgramSpec {
  std::string name;     // "pipetrain", "coordinator", ...
  std::string summary;  // first line of --help.
  // Its commands; empty for a program without commands (the daemons), whose flags are then
  // `flags` (see ProgramFlags).
  std::vector<CommandSpec> commands;
  std::vector<std::string> flags;
  std::string footer;  // printed at the end of --help / --helpfull (environment, files); may be "".
  // The default --help shows for a flag in every command (or the daemon), where its ABSL_FLAG
  // default is a placeholder: {"data_dir", "$PIPETRAIN_DATA_DIR, else ..."}. See
  // CommandSpec::defaults.
  std::map<std::string, std::string> defaults = {};
  // Headings for the flags of `COMMAND --help` (and a daemon's --help): each command's flags are
  // listed under the first topic that names them, topics in this order, then those no topic
  // names under "other"; flag files come last. Empty: one list, in the command's order.
  std::vector<HelpTopic> flag_topics = {};
  // Headings for the commands of `--help`: each topic's commands, in its order (a command no topic
  // names under "other commands"). Empty: one list, "commands:".
  std::vector<HelpTopic> command_topics = {};
};

// The command line after ParseCommandLine.
struct CommandLine {
  // Set if --help/-h/--helpshort or --helpfull was given, or the program has commands and the
  // first argument is `help` (`help COMMAND` is `COMMAND --help`; `help` alone is --help), or
  // --version was given (then it is util::VersionLine and a newline, whatever else was given):
  // the text to print on stdout (then exit 0); nothing else is set or parsed then. Not set for help
  // on an unknown command, which is then the unknown command (`command` null, `command_name` it).
  std::string help;
  // The command (program with commands): nullptr if missing or unknown (`command_name` holds
  // what was given, "" if nothing).
  const CommandSpec* command = nullptr;
  std::string command_name;
  // Positional arguments after the command (all of them for a program without commands).
  std::vector<std::string> args;
  // Flags given on the command line or in a flag file (names with underscores).
  std::set<std::string> given;

  // True if the flag named `name` (underscores) was given, whatever its value.
  bool Given(absl::string_view name) const { return given.count(std::string(name)) != 0; }
};

// Parses argv for `program` (which must outlive the result): expands --flagfile, normalises flag
// names, refuses unknown flags and, for a known command, flags it does not list (absl's own flags
// --fromenv, --tryfromenv, --undefok and --only_check_args are allowed everywhere);
// then sets the flag values with absl::ParseCommandLine (which exits 1 with its message on a
// malformed value). Help requests return CommandLine::help without parsing values. Errors:
// INVALID_ARGUMENT naming the flag, with a "did you mean" where a listed flag is close; NOT_FOUND
// for a flag file that cannot be read. A missing or unknown command is not an error here
// (CommandLine::command is null). Call once, from main(); not thread-safe.
absl::StatusOr<CommandLine> ParseCommandLine(const ProgramSpec& program, int argc, char** argv);

// A daemon's command line (`program` has no commands and takes no arguments): nullopt when main()
// should go on; else the exit code after --help or --version was printed on stdout (0) or the
// error, prefixed with the program's name, on stderr (2). Call once, from main().
std::optional<int> ParseDaemonCommandLine(const ProgramSpec& program, int argc, char** argv);

// The per-command help `pipetrain COMMAND --help` prints: synopsis, summary and every flag of
// `command` with its default (CommandSpec::defaults, else ProgramSpec::defaults, else the
// ABSL_FLAG's: "none" for an empty string) and meaning, under the program's flag topics. Flags must
// be registered.
std::string CommandHelp(const ProgramSpec& program, const CommandSpec& command);

// The program's help: its commands under the program's command topics (or, without commands, its
// flags) and the footer; with `full`, also every command's flags.
std::string ProgramHelp(const ProgramSpec& program, bool full);

// Every registered flag not defined by Abseil itself, sorted: a daemon's flags, so that a flag
// added with ABSL_FLAG in its main.cc is listed and accepted without further registration.
std::vector<std::string> ProgramFlags();

// `name` (with underscores) as written on the command line: "--data-dir".
std::string DashedFlag(absl::string_view name);

// The candidate closest to `given` by edit distance if it is close enough to be a likely typo
// (or `given` is a prefix of it); "" otherwise. Names compare with dashes as underscores.
std::string ClosestName(absl::string_view given, const std::vector<std::string>& candidates);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_UTIL_COMMAND_LINE_H_
