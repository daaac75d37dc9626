#include "common/schedule/timeline_render.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pipetrain::schedule {
namespace {

// Longest grid we draw, whatever the options say (guards against tiny time_per_cell values).
constexpr int64_t kMaxAsciiCells = 1 << 16;

// Actions with non-finite or negative times, or end < start (possible in measured timelines), are
// left out of the pictures.
bool Drawable(const TimedAction& t) {
  return std::isfinite(t.start) && std::isfinite(t.end) && t.start >= 0 && t.end >= t.start;
}

// Latest end over the drawable actions.
double DrawnMakespan(const Timeline& timeline) {
  double makespan = 0;
  for (const std::vector<TimedAction>& list : timeline.workers) {
    for (const TimedAction& t : list) {
      if (Drawable(t)) makespan = std::max(makespan, t.end);
    }
  }
  return makespan;
}

int64_t CellOf(double time, double per_cell) {
  return static_cast<int64_t>(std::llround(time / per_cell));
}

const char* OpColor(Op op) {
  switch (op) {
    case Op::kForward:
      return "#4e79a7";
    case Op::kBackward:
      return "#59a14f";
    case Op::kInputGrad:
      return "#8cd17d";
    case Op::kWeightGrad:
      return "#b07aa1";
  }
  return "#999999";
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kForward:
      return "forward";
    case Op::kBackward:
      return "backward";
    case Op::kInputGrad:
      return "input grad";
    case Op::kWeightGrad:
      return "weight grad";
  }
  return "unknown";
}

// `text` with the XML special characters escaped, for element content and attribute values.
std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// " ms" for unit "ms"; "" for none.
std::string UnitSuffix(const std::string& unit) { return unit.empty() ? "" : " " + unit; }

// A "nice" axis step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`.
double NiceStep(double span, int ticks) {
  if (!(span > 0)) return 1;
  const double raw = span / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

}  // namespace

std::string ActionLabel(const Placement& placement, const Action& action) {
  std::string label = absl::StrCat(OpLetter(action.op), action.mb);
  if (placement.virtual_stages > 1 && placement.stages > 0 && action.chunk >= 0 &&
      action.chunk < placement.num_chunks()) {
    label.push_back(static_cast<char>('a' + placement.LocalIndexOf(action.chunk) % 26));
  }
  return label;
}

std::string RenderAscii(const Timeline& timeline, const AsciiOptions& options) {
  const double makespan = DrawnMakespan(timeline);
  size_t widest = 2;
  double shortest = std::numeric_limits<double>::infinity();
  for (const std::vector<TimedAction>& list : timeline.workers) {
    for (const TimedAction& t : list) {
      if (!Drawable(t)) continue;
      widest = std::max(widest, ActionLabel(timeline.placement, t.action).size());
      if (t.end > t.start) shortest = std::min(shortest, t.end - t.start);
    }
  }
  double per_cell = options.time_per_cell;
  if (!(per_cell > 0) || !std::isfinite(per_cell)) {
    per_cell = std::isfinite(shortest) ? shortest : 1.0;
    if (options.max_cells > 0 && makespan / per_cell > options.max_cells) {
      per_cell = makespan / options.max_cells;
    }
  }
  if (makespan / per_cell > kMaxAsciiCells) per_cell = makespan / kMaxAsciiCells;
  const int64_t width = static_cast<int64_t>(widest) + 1;
  int64_t cells = 0;
  for (const std::vector<TimedAction>& list : timeline.workers) {
    for (const TimedAction& t : list) {
      if (!Drawable(t)) continue;
      const int64_t c0 = CellOf(t.start, per_cell);
      cells = std::max(cells, std::max(c0 + 1, CellOf(t.end, per_cell)));
    }
  }
  const std::string last_name =
      absl::StrCat("r", timeline.workers.empty() ? 0 : timeline.workers.size() - 1);
  const size_t name_width = std::max<size_t>(last_name.size(), 4) + 1;  // "r12  " / "time "

  std::string out;
  // Ruler: the time at every fifth cell, where it fits.
  std::string ruler(cells * width, ' ');
  size_t free_from = 0;
  for (int64_t c = 0; c < cells; c += 5) {
    const std::string mark = absl::StrCat(c * per_cell);
    const size_t at = c * width;
    if (at < free_from || at + mark.size() > ruler.size()) continue;
    ruler.replace(at, mark.size(), mark);
    free_from = at + mark.size() + 1;
  }
  std::string ruler_name = "time";
  ruler_name.resize(name_width, ' ');
  absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(absl::StrCat(ruler_name, "|", ruler)),
                  "\n");

  for (size_t w = 0; w < timeline.workers.size(); ++w) {
    std::string row(cells * width, '.');
    for (const TimedAction& t : timeline.workers[w]) {
      if (!Drawable(t)) continue;
      const int64_t c0 = CellOf(t.start, per_cell);
      const int64_t c1 = std::max(c0 + 1, CellOf(t.end, per_cell));
      const size_t begin = c0 * width;
      const size_t end = c1 * width;  // Exclusive; the last character stays a separator.
      const std::string label = ActionLabel(timeline.placement, t.action);
      for (size_t i = begin; i + 1 < end; ++i) {
        row[i] = i - begin < label.size() ? label[i - begin] : '-';
      }
      row[end - 1] = ' ';
    }
    std::string name = absl::StrCat("r", w);
    name.resize(name_width, ' ');
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(absl::StrCat(name, "|", row)), "\n");
  }
  const std::string unit =
      options.time_unit.empty() ? (per_cell == 1 ? "time unit" : "time units") : options.time_unit;
  absl::StrAppend(&out, "1 cell = ", per_cell, " ", unit, "; makespan ", makespan,
                  UnitSuffix(options.time_unit),
                  "; F forward, B backward, I input grad, W weight grad, . idle");
  if (timeline.placement.virtual_stages > 1) {
    absl::StrAppend(&out, "; a, b, ... = the rank's chunks in model order");
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string RenderChromeTrace(const Timeline& timeline, double microseconds_per_time_unit) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", 0},
                    {"args", {{"name", "pipetrain schedule"}}}});
  for (size_t w = 0; w < timeline.workers.size(); ++w) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", w},
                      {"args", {{"name", absl::StrCat("rank ", w)}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", w},
                      {"args", {{"sort_index", w}}}});
  }
  for (size_t w = 0; w < timeline.workers.size(); ++w) {
    for (const TimedAction& t : timeline.workers[w]) {
      if (!Drawable(t)) continue;
      events.push_back({{"name", ActionLabel(timeline.placement, t.action)},
                        {"cat", std::string(OpLetter(t.action.op))},
                        {"ph", "X"},
                        {"ts", t.start * microseconds_per_time_unit},
                        {"dur", std::max(0.0, t.end - t.start) * microseconds_per_time_unit},
                        {"pid", 0},
                        {"tid", w},
                        {"args",
                         {{"op", std::string(OpLetter(t.action.op))},
                          {"mb", t.action.mb},
                          {"chunk", t.action.chunk}}}});
    }
  }
  nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump() + "\n";
}

std::string RenderSvg(const Timeline& timeline, const SvgOptions& options) {
  const double makespan = DrawnMakespan(timeline);
  const double px = options.pixels_per_time_unit > 0 ? options.pixels_per_time_unit
                    : makespan > 0                   ? std::max(1, options.max_width_px) / makespan
                                                     : 1.0;
  const int row = std::max(8, options.row_height_px);
  const double left = 70;
  const double top = 34;
  const int workers = static_cast<int>(timeline.workers.size());
  const double plot_width = makespan * px;
  const std::string unit = UnitSuffix(options.time_unit);
  const std::string header = absl::StrCat(options.title, options.title.empty() ? "" : "; ",
                                          absl::StrFormat("makespan %g", makespan), unit);
  // The header line (12 px monospace: about 7.2 px a character) fits in the picture.
  const double width = std::max(left + plot_width + 20, left + 7.5 * header.size() + 20);
  const double height = top + workers * row + 50;
  const int v = std::max(1, timeline.placement.virtual_stages);

  std::string out;
  absl::StrAppend(&out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
                                  "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                                  "font-family=\"monospace\" font-size=\"10\">\n",
                                  width, height, width, height));
  if (!options.title.empty()) {
    absl::StrAppend(&out, "<title>", XmlEscape(options.title), "</title>\n");
  }
  absl::StrAppend(&out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                  absl::StrFormat("<text x=\"%.1f\" y=\"14\" font-size=\"12\">%s</text>\n", left,
                                  XmlEscape(header)));
  if (!options.time_unit.empty()) {
    absl::StrAppend(&out, absl::StrFormat("<text x=\"4\" y=\"%.1f\">%s</text>\n", top - 7,
                                          XmlEscape(options.time_unit)));
  }
  // Time axis with grid lines.
  const double step = NiceStep(makespan, 10);
  for (double t = 0; t <= makespan + step * 1e-9; t += step) {
    const double x = left + t * px;
    absl::StrAppend(&out,
                    absl::StrFormat("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" "
                                    "stroke=\"#dddddd\"/>\n",
                                    x, top - 4, x, top + workers * row),
                    absl::StrFormat("<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%g"
                                    "</text>\n",
                                    x, top - 7, t));
  }
  std::set<Op> drawn;
  for (int w = 0; w < workers; ++w) {
    const double y = top + w * row;
    absl::StrAppend(
        &out, absl::StrFormat("<text x=\"4\" y=\"%.1f\">rank %d</text>\n", y + row * 0.5 + 3.5, w));
    for (const TimedAction& t : timeline.workers[w]) {
      if (!Drawable(t)) continue;
      const double x = left + t.start * px;
      const double wd = (t.end - t.start) * px;
      const int local = t.action.chunk >= 0 && t.action.chunk < timeline.placement.num_chunks()
                            ? timeline.placement.LocalIndexOf(t.action.chunk)
                            : 0;
      const double opacity = v > 1 ? 1.0 - 0.5 * local / (v - 1) : 1.0;
      const std::string label = ActionLabel(timeline.placement, t.action);
      drawn.insert(t.action.op);
      absl::StrAppend(&out,
                      absl::StrFormat("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                                      "height=\"%d\" fill=\"%s\" fill-opacity=\"%.2f\" "
                                      "stroke=\"white\" stroke-width=\"0.5\"><title>%s "
                                      "chunk %d [%g, %g)%s</title></rect>\n",
                                      x, y + 1, wd, row - 2, OpColor(t.action.op), opacity, label,
                                      t.action.chunk, t.start, t.end, XmlEscape(unit)));
      if (wd >= 6.5 * static_cast<double>(label.size())) {
        absl::StrAppend(&out, absl::StrFormat("<text x=\"%.2f\" y=\"%.1f\" "
                                              "text-anchor=\"middle\">%s</text>\n",
                                              x + wd / 2, y + row * 0.5 + 3.5, label));
      }
    }
  }
  // Marks: a dashed line over the rows, its label above the axis labels' line.
  for (const TimeMark& mark : options.marks) {
    if (!std::isfinite(mark.time) || mark.time < 0 || mark.time > makespan) continue;
    const double x = left + mark.time * px;
    absl::StrAppend(&out,
                    absl::StrFormat("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" "
                                    "stroke=\"#555555\" stroke-dasharray=\"4 3\"/>\n",
                                    x, top - 4, x, top + workers * row),
                    absl::StrFormat("<text x=\"%.2f\" y=\"%.1f\" fill=\"#555555\">%s</text>\n",
                                    x + 2, top + workers * row + 10, XmlEscape(mark.label)));
  }
  // Legend: the kinds of action drawn.
  const double ly = top + workers * row + 30;
  double lx = left;
  absl::StrAppend(&out, "<g id=\"legend\">\n");
  for (Op op : {Op::kForward, Op::kBackward, Op::kInputGrad, Op::kWeightGrad}) {
    if (drawn.count(op) == 0) continue;
    const std::string entry = absl::StrCat(OpLetter(op), " ", OpName(op));
    absl::StrAppend(&out, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" "
                                          "fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                                          lx, ly - 10, OpColor(op), lx + 16, ly, entry));
    lx += 16 + 6.5 * entry.size() + 14;
  }
  if (v > 1) {
    absl::StrAppend(&out, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\">a, b, ... = the rank's "
                                          "chunks in model order (later ones lighter)</text>\n",
                                          lx, ly));
  }
  absl::StrAppend(&out, "</g>\n</svg>\n");
  return out;
}

}  // namespace pipetrain::schedule
