#include "common/util/command_line.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <set>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/build_info.h"

namespace pipetrain {
namespace {

// Nested --flagfile deeper than this is refused (a file that names itself).
constexpr int kMaxFlagfileDepth = 10;
// Help text is wrapped to this width.
constexpr size_t kHelpWidth = 100;

// Abseil's own flags that every command accepts (its --help* flags and --version are answered
// here).
bool IsAbslBuiltin(absl::string_view name) {
  return name == "fromenv" || name == "tryfromenv" || name == "undefok" ||
         name == "only_check_args";
}

// One argument and where it came from.
struct Arg {
  std::string text;
  std::string where;  // "" on the command line; "FILE:LINE" in a flag file.
};

std::string Underscored(absl::string_view name) { return absl::StrReplaceAll(name, {{"-", "_"}}); }

// The arguments of the flag file `path`, one per line (absl's format: blank lines and lines
// starting with '#' skipped, surrounding whitespace stripped), appended to `out`. A line
// `--name value` (whitespace before any '=') is taken as `--name=value`. Nested --flagfile lines
// are expanded in place.
absl::Status ReadFlagfile(const std::string& path, int depth, std::vector<Arg>* out);

// Appends `arg` to `out`, expanding it if it is --flagfile=FILE[,FILE...]. `next` is the
// following argument, consumed (set to true in `*used_next`) for `--flagfile FILE`.
absl::Status ExpandArg(const Arg& arg, const Arg* next, int depth, std::vector<Arg>* out,
                       bool* used_next) {
  *used_next = false;
  absl::string_view a = arg.text;
  if (a.size() < 2 || a[0] != '-' || a == "--") {
    out->push_back(arg);
    return absl::OkStatus();
  }
  absl::string_view body = a.substr(a[1] == '-' ? 2 : 1);
  const size_t eq = body.find('=');
  if (Underscored(body.substr(0, eq)) != "flagfile") {
    out->push_back(arg);
    return absl::OkStatus();
  }
  std::string files;
  if (eq != absl::string_view::npos) {
    files = std::string(body.substr(eq + 1));
  } else if (next != nullptr) {
    files = next->text;
    *used_next = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--flagfile needs a file", arg.where.empty() ? "" : " in " + arg.where));
  }
  if (depth >= kMaxFlagfileDepth) {
    return absl::InvalidArgumentError(absl::StrCat("--flagfile ", files, " in ", arg.where,
                                                   ": flag files nested more than ",
                                                   kMaxFlagfileDepth, " deep"));
  }
  for (absl::string_view file : absl::StrSplit(files, ',', absl::SkipEmpty())) {
    if (absl::Status s = ReadFlagfile(std::string(file), depth + 1, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadFlagfile(const std::string& path, int depth, std::vector<Arg>* out) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--flagfile ", path, ": cannot read it (", std::strerror(errno), ")"));
  }
  std::vector<Arg> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    Arg arg{std::string(text), absl::StrCat(path, ":", number)};
    if (text[0] != '-' || text == "--") {
      return absl::InvalidArgumentError(absl::StrCat(arg.where, ": expected --flag=value, got '",
                                                     text, "' (flag files hold flags only)"));
    }
    const size_t space = text.find_first_of(" \t");
    if (space != absl::string_view::npos && text.substr(0, space).find('=') == std::string::npos) {
      arg.text = absl::StrCat(text.substr(0, space), "=",
                              absl::StripLeadingAsciiWhitespace(text.substr(space)));
    }
    lines.push_back(std::move(arg));
  }
  for (const Arg& arg : lines) {
    bool unused = false;
    if (absl::Status s = ExpandArg(arg, nullptr, depth, out, &unused); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// " (in FILE:LINE)" for a flag from a flag file.
std::string Where(const Arg& arg) {
  return arg.where.empty() ? "" : absl::StrCat(" (in ", arg.where, ")");
}

// Edit distance (insertions, deletions, substitutions) between `a` and `b`.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean --x?)" or "".
std::string Suggestion(absl::string_view given, const std::vector<std::string>& candidates) {
  const std::string closest = ClosestName(given, candidates);
  return closest.empty() ? "" : absl::StrCat(" (did you mean ", DashedFlag(closest), "?)");
}

// "pipetrain train" / "coordinator".
std::string Invocation(const ProgramSpec& program, const CommandSpec& command) {
  return command.name.empty() ? program.name : absl::StrCat(program.name, " ", command.name);
}

// `text` wrapped to kHelpWidth, each line starting with `indent`.
std::string Wrapped(absl::string_view text, absl::string_view indent) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > kHelpWidth) {
      absl::StrAppend(&out, indent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, indent, line, "\n");
  return out;
}

// "  --name (default: X)\n      help...\n" for one flag; X is `shown` unless it is empty (then
// the ABSL_FLAG's default); "  --name (required)" if `shown` is kRequired.
std::string FlagHelp(absl::string_view name, absl::string_view shown) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return absl::StrCat("  ", DashedFlag(name), " (not defined)\n");
  std::string value(shown);
  if (value.empty()) {
    value = flag->DefaultValue();
    if (value.empty()) {
      value = "none";
    } else if (flag->IsOfType<std::string>()) {
      value = absl::StrCat("\"", value, "\"");
    }
  }
  return absl::StrCat("  ", DashedFlag(name),
                      shown == kRequired ? " (required)" : absl::StrCat(" (default: ", value, ")"),
                      "\n", Wrapped(flag->Help(), "      "));
}

// The default --help shows for `name` in `command` ("" for the ABSL_FLAG's).
std::string ShownDefault(const ProgramSpec& program, const CommandSpec& command,
                         const std::string& name) {
  if (auto it = command.defaults.find(name); it != command.defaults.end()) return it->second;
  if (auto it = program.defaults.find(name); it != program.defaults.end()) return it->second;
  return "";
}

// `names` grouped by `topics`: each under the first topic that has it, in the topic's order, the
// others under `other` in their own order; only the topics that get a name.
std::vector<HelpTopic> Grouped(const std::vector<HelpTopic>& topics,
                               const std::vector<std::string>& names, const std::string& other) {
  std::vector<HelpTopic> groups;
  std::set<std::string> placed;
  for (const HelpTopic& topic : topics) {
    HelpTopic group{topic.heading, {}};
    for (const std::string& name : topic.names) {
      if (std::find(names.begin(), names.end(), name) != names.end() &&
          placed.insert(name).second) {
        group.names.push_back(name);
      }
    }
    if (!group.names.empty()) groups.push_back(std::move(group));
  }
  HelpTopic rest{other, {}};
  for (const std::string& name : names) {
    if (placed.count(name) == 0) rest.names.push_back(name);
  }
  if (!rest.names.empty()) groups.push_back(std::move(rest));
  return groups;
}

// One line per command of `names`: "  NAME ARGS   summary", the summaries aligned at `width`.
std::string CommandLines(const ProgramSpec& program, const std::vector<std::string>& names,
                         size_t width) {
  std::string out;
  for (const std::string& name : names) {
    for (const CommandSpec& c : program.commands) {
      if (c.name != name) continue;
      const std::string head = c.args.empty() ? c.name : absl::StrCat(c.name, " ", c.args);
      absl::StrAppend(&out, "  ", head, std::string(width + 2 - head.size(), ' '), c.summary, "\n");
    }
  }
  return out;
}

}  // namespace

std::string DashedFlag(absl::string_view name) {
  return absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}));
}

std::string ClosestName(absl::string_view given, const std::vector<std::string>& candidates) {
  const std::string g = Underscored(given);
  std::string best;
  size_t best_distance = 0;
  for (const std::string& c : candidates) {
    if (g.size() >= 3 && absl::StartsWith(c, g)) return c;  // --check -> --checkpoint
    const size_t d = EditDistance(g, c);
    if (best.empty() || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  // A typo changes a few letters; more than a third of the word is another word.
  const size_t limit = std::max<size_t>(2, g.size() / 3);
  return !best.empty() && best_distance <= limit ? best : "";
}

std::vector<std::string> ProgramFlags() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), "absl/flags/")) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string CommandHelp(const ProgramSpec& program, const CommandSpec& command) {
  std::string out = absl::StrCat("usage: ", Invocation(program, command),
                                 command.args.empty() ? "" : " " + command.args, " [flags]\n");
  absl::StrAppend(&out, Wrapped(command.name.empty() ? program.summary : command.summary, "  "));
  absl::StrAppend(&out, "\nflags (--name=VALUE or --name VALUE; dashes or underscores):\n");
  const std::string flagfile = absl::StrCat(
      "  --flagfile FILE\n", Wrapped("read more flags from FILE, one per line ('#' comments); a "
                                     "configuration file for this command",
                                     "      "));
  if (program.flag_topics.empty()) {
    for (const std::string& name : command.flags) {
      absl::StrAppend(&out, FlagHelp(name, ShownDefault(program, command, name)));
    }
    return out + flagfile;
  }
  for (const HelpTopic& group : Grouped(program.flag_topics, command.flags, "other")) {
    absl::StrAppend(&out, "\n", group.heading, ":\n");
    for (const std::string& name : group.names) {
      absl::StrAppend(&out, FlagHelp(name, ShownDefault(program, command, name)));
    }
  }
  absl::StrAppend(&out, "\nflag files:\n", flagfile);
  return out;
}

std::string ProgramHelp(const ProgramSpec& program, bool full) {
  std::string out;
  if (program.commands.empty()) {
    out = CommandHelp(program, CommandSpec{"", "", program.summary, program.flags});
  } else {
    out =
        absl::StrCat("usage: ", program.name, " COMMAND [flags]\n", Wrapped(program.summary, "  "));
    size_t width = 0;
    std::vector<std::string> names;
    for (const CommandSpec& c : program.commands) {
      width = std::max(width, c.name.size() + (c.args.empty() ? 0 : c.args.size() + 1));
      names.push_back(c.name);
    }
    if (program.command_topics.empty()) {
      absl::StrAppend(&out, "\ncommands:\n", CommandLines(program, names, width));
    } else {
      for (const HelpTopic& group : Grouped(program.command_topics, names, "other commands")) {
        absl::StrAppend(&out, "\n", group.heading, ":\n",
                        CommandLines(program, group.names, width));
      }
    }
    absl::StrAppend(&out, "\n`", program.name, " help COMMAND` (or `", program.name,
                    " COMMAND --help`) lists a command's flags; `", program.name,
                    " --helpfull` every command's.\n");
    if (full) {
      for (const CommandSpec& c : program.commands) {
        absl::StrAppend(&out, "\n", CommandHelp(program, c));
      }
    }
  }
  if (!program.footer.empty()) absl::StrAppend(&out, "\n", program.footer);
  return out;
}

absl::StatusOr<CommandLine> ParseCommandLine(const ProgramSpec& program, int argc, char** argv) {
  std::vector<Arg> raw;
  for (int i = 1; i < argc; ++i) raw.push_back(Arg{argv[i], ""});
  // 1. Flag files expanded in place (up to a lone "--": the rest are arguments).
  std::vector<Arg> args;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i].text == "--") {
      args.insert(args.end(), raw.begin() + static_cast<std::ptrdiff_t>(i), raw.end());
      break;
    }
    bool used_next = false;
    if (absl::Status s =
            ExpandArg(raw[i], i + 1 < raw.size() ? &raw[i + 1] : nullptr, 0, &args, &used_next);
        !s.ok()) {
      return s;
    }
    if (used_next) ++i;
  }

  // 2. Flags told apart from arguments, names normalised, values attached (--name=value).
  CommandLine result;
  std::vector<std::string> for_absl = {argv[0]};
  std::vector<const Arg*> unknown;
  std::vector<std::pair<std::string, const Arg*>> given_flags;  // name, where
  bool help = false, help_full = false, version = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const Arg& arg = args[i];
    absl::string_view a = arg.text;
    if (a == "--") {
      for (++i; i < args.size(); ++i) result.args.push_back(args[i].text);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      result.args.push_back(arg.text);
      continue;
    }
    absl::string_view body = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = Underscored(body.substr(0, eq));
    if (name == "h" || name == "help" || name == "helpshort" || name == "helpfull") {
      help = true;
      help_full = help_full || name == "helpfull";
      continue;
    }
    if (name == "version") {
      version = true;
      continue;
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string spelt = name;
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --nojson
      const absl::CommandLineFlag* positive = absl::FindCommandLineFlag(name.substr(2));
      if (positive != nullptr && positive->IsOfType<bool>()) flag = positive;
    }
    if (flag == nullptr) {
      unknown.push_back(&arg);
      continue;
    }
    std::string text = absl::StrCat("--", spelt);
    if (eq != absl::string_view::npos) {
      absl::StrAppend(&text, "=", body.substr(eq + 1));
    } else if (!flag->IsOfType<bool>()) {
      if (!arg.where.empty() || i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(DashedFlag(name), " needs a value", Where(arg)));
      }
      absl::StrAppend(&text, "=", args[++i].text);
    }
    given_flags.emplace_back(flag->Name(), &arg);
    for_absl.push_back(std::move(text));
  }

  if (version) {
    result.help = util::VersionLine(program.name) + "\n";
    return result;
  }

  // 3. The command, and help.
  const CommandSpec* command = nullptr;
  CommandSpec whole{"", "", program.summary, program.flags};
  std::vector<std::string> candidates = program.flags;
  if (program.commands.empty()) {
    command = &whole;
  } else if (!result.args.empty()) {
    result.command_name = result.args.front();
    result.args.erase(result.args.begin());
    // `help [COMMAND]`, unless the program has a command of that name.
    const bool help_command = result.command_name == "help" &&
                              std::none_of(program.commands.begin(), program.commands.end(),
                                           [](const CommandSpec& c) { return c.name == "help"; });
    if (help_command) {
      help = true;
      result.command_name.clear();
      if (!result.args.empty()) {
        result.command_name = result.args.front();
        result.args.erase(result.args.begin());
      }
    }
    for (const CommandSpec& c : program.commands) {
      if (c.name == result.command_name) result.command = command = &c;
    }
    if (command == nullptr) {
      for (const CommandSpec& c : program.commands) {
        candidates.insert(candidates.end(), c.flags.begin(), c.flags.end());
      }
    }
  }
  // Help on an unknown command is the unknown command (the caller names it and lists the
  // commands); help with no command is the program's.
  if (help && (command != nullptr || result.command_name.empty())) {
    result.help = help_full || command == nullptr || command == &whole
                      ? ProgramHelp(program, help_full)
                      : CommandHelp(program, *command);
    return result;
  }
  if (help) return result;
  if (command != nullptr) candidates = command->flags;
  const std::string see =
      command == nullptr
          ? absl::StrCat("; `", program.name, " --helpfull` lists every flag")
          : absl::StrCat("; `", Invocation(program, *command), " --help` lists its flags");

  // 4. Unknown flags, then flags the command does not take.
  if (!unknown.empty()) {
    std::vector<std::string> parts;
    for (const Arg* arg : unknown) {
      absl::string_view body = arg->text;
      body.remove_prefix(body.size() > 1 && body[1] == '-' ? 2 : 1);
      const std::string name = Underscored(body.substr(0, body.find('=')));
      parts.push_back(absl::StrCat("unknown flag ", DashedFlag(name), Where(*arg),
                                   Suggestion(name, candidates)));
    }
    return absl::InvalidArgumentError(absl::StrCat(absl::StrJoin(parts, "; "), see));
  }
  if (command != nullptr) {
    std::vector<std::string> foreign, suggestions;
    for (const auto& [name, arg] : given_flags) {
      if (IsAbslBuiltin(name) ||
          std::find(command->flags.begin(), command->flags.end(), name) != command->flags.end()) {
        continue;
      }
      foreign.push_back(absl::StrCat(DashedFlag(name), Where(*arg)));
      suggestions.push_back(Suggestion(name, candidates));
    }
    if (!foreign.empty()) {
      std::sort(foreign.begin(), foreign.end());
      foreign.erase(std::unique(foreign.begin(), foreign.end()), foreign.end());
      suggestions.erase(std::remove(suggestions.begin(), suggestions.end(), ""), suggestions.end());
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(foreign, ", "), " not used by `", Invocation(program, *command), "`",
          suggestions.empty() ? "" : suggestions.front(), see));
    }
  }
  for (const auto& [name, arg] : given_flags) result.given.insert(name);

  // 5. The values, parsed by Abseil.
  std::vector<char*> pointers;
  for (std::string& s : for_absl) pointers.push_back(s.data());
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return result;
}

std::optional<int> ParseDaemonCommandLine(const ProgramSpec& program, int argc, char** argv) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(program, argc, argv);
  if (!line.ok()) {
    std::cerr << program.name << ": " << line.status().message() << "\n";
    return 2;
  }
  if (!line->help.empty()) {
    std::cout << line->help;
    return 0;
  }
  if (!line->args.empty()) {
    std::cerr << program.name << ": unexpected argument '" << line->args.front() << "'\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace pipetrain
