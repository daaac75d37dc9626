// Pictures of a Timeline (simulated or measured): an ASCII grid, a Chrome trace and an SVG.
//
// Labels: op letter + micro-batch ("F3"); when a rank holds several chunks (V > 1) a letter names
// which of its chunks, in model order ("F3a" = first chunk, "F3b" = second, ...).
// Pure functions; thread-safe. Actions with non-finite or negative times or end < start (possible
// in measured timelines) are left out.
#ifndef PIPETRAIN_COMMON_SCHEDULE_TIMELINE_RENDER_H_
#define PIPETRAIN_COMMON_SCHEDULE_TIMELINE_RENDER_H_

#include <string>
#include <vector>

#include "common/schedule/timeline.h"

namespace pipetrain::schedule {

// The label of `action` in the pictures (see above).
std::string ActionLabel(const Placement& placement, const Action& action);

struct AsciiOptions {
  // Time units per grid cell; 0 picks the shortest action duration (so uniform costs draw
  // exactly), coarsened if the grid would exceed max_cells.
  double time_per_cell = 0;
  // Upper bound on cells per row when time_per_cell is 0; 0 means no bound.
  int max_cells = 200;
  // Name of the time unit in the legend ("ms" for measured timelines); empty: "time unit(s)".
  std::string time_unit;
};

// One row per rank ("r0", "r1", ...), time across. Every cell is as wide as the widest label plus
// one; an action covering n cells prints its label followed by '-' up to its last cell; '.' marks
// idle cells. A ruler above gives the time of every fifth cell; a legend below gives the scale and
// makespan.
// Actions shorter than a cell still take one (so a coarse grid may overwrite a neighbour).
std::string RenderAscii(const Timeline& timeline, const AsciiOptions& options = {});

// Chrome trace event JSON (chrome://tracing, https://ui.perfetto.dev): one process, one thread
// track per rank ("rank w"), one complete ("X") event per action with args op, mb, chunk.
// Times are multiplied by `microseconds_per_time_unit` (1000 shows one time unit as 1 ms).
std::string RenderChromeTrace(const Timeline& timeline, double microseconds_per_time_unit = 1000);

// A labelled vertical line across the rows of an SVG (e.g. where each measured step starts).
struct TimeMark {
  double time = 0;
  std::string label;
};

struct SvgOptions {
  double pixels_per_time_unit = 0;  // 0: fit the makespan into max_width_px.
  int max_width_px = 1600;          // Width of the time area when pixels_per_time_unit is 0.
  int row_height_px = 24;
  // What the picture shows (e.g. "1f1b: S=4 M=8 V=1, predicted bubble 0.273"): the document's
  // <title> and the start of its first line. Empty: the first line gives the makespan alone.
  std::string title;
  // Name of the time unit ("ms"), after the makespan, in tooltips and beside the axis; empty: none.
  std::string time_unit;
  // Dashed vertical lines with their labels at the top; marks outside [0, makespan] are left out.
  std::vector<TimeMark> marks;
};

// A standalone SVG document: a title line, one row per rank ("rank w"), one rectangle per action
// coloured by op (F blue, B green, I light green, W purple; later chunks of a rank drawn lighter)
// with a tooltip, labels where they fit, a time axis, the marks, and a legend (<g id="legend">)
// listing only the kinds of action drawn ("F forward", "B backward", "I input grad", "W weight
// grad"). Text is XML-escaped.
std::string RenderSvg(const Timeline& timeline, const SvgOptions& options = {});

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_TIMELINE_RENDER_H_
